// A wall-clock sampler of one thread, loaded with LD_PRELOAD by scripts/host_profile.sh: where a
// program's host time goes on a machine with no perf (nor gdb) to ask. A CLOCK_MONOTONIC timer
// signals the thread that loaded the library (the program's main thread) every
// GW_HOST_PROFILE_US microseconds; the handler stores the interrupted call stack (backtrace(),
// unwound through the libraries' .eh_frame, so no frame pointers are needed). At exit the
// samples and the process's /proc/self/maps go to $GW_HOST_PROFILE_OUT.{samples,maps} for
// scripts/host_profile.py to symbolize. Without GW_HOST_PROFILE_US the library does nothing.
// Costs: each sample unwinds the stack (tens of µs through a driver's frames), so sample at 200 µs
// or more and read the result as shares of the time, not as times. backtrace() is not
// async-signal-safe: a signal that lands while the thread holds the dynamic loader's lock, or a
// frame without unwind information, can hang or crash the program; the script runs it under a
// timeout.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cerrno>
#include <execinfo.h>
#include <fstream>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

namespace {
constexpr int kDepth = 48;
constexpr long kMaxSamples = 400000;
void** g_frames = nullptr;  // kMaxSamples x kDepth
int* g_depth = nullptr;
std::atomic<long> g_taken{0};
std::atomic<bool> g_busy{false};
timer_t g_timer;
bool g_on = false;

void on_tick(int, siginfo_t*, void*) {
  if (g_busy.exchange(true)) return;  // a tick inside a tick: dropped
  const int saved = errno;
  const long i = g_taken.fetch_add(1);
  if (i < kMaxSamples) g_depth[i] = backtrace(g_frames + i * kDepth, kDepth);
  errno = saved;
  g_busy.store(false);
}

void write_out() {
  if (!g_on) return;
  timer_delete(g_timer);
  g_on = false;
  const char* out = std::getenv("GW_HOST_PROFILE_OUT");
  if (!out || !*out) return;
  const std::string base(out);
  {
    std::ifstream maps("/proc/self/maps");
    std::ofstream copy(base + ".maps");
    copy << maps.rdbuf();
  }
  FILE* f = std::fopen((base + ".samples").c_str(), "w");
  if (!f) {
    std::perror("host_sampler: cannot write the samples");
    return;
  }
  const long n = std::min(g_taken.load(), kMaxSamples);
  for (long i = 0; i < n; ++i) {
    for (int k = 0; k < g_depth[i]; ++k) {
      std::fprintf(f, "%lx ", reinterpret_cast<unsigned long>(g_frames[i * kDepth + k]));
    }
    std::fputc('\n', f);
  }
  std::fclose(f);
}

__attribute__((constructor)) void start() {
  const char* us = std::getenv("GW_HOST_PROFILE_US");
  if (!us || std::atol(us) <= 0) return;
  g_frames = static_cast<void**>(std::calloc(kMaxSamples * kDepth, sizeof(void*)));
  g_depth = static_cast<int*>(std::calloc(kMaxSamples, sizeof(int)));
  if (!g_frames || !g_depth) {
    std::fputs("host_sampler: no memory for the samples; not sampling\n", stderr);
    return;
  }
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder (libgcc_s) here, not in the first tick
  struct sigaction sa {};
  sa.sa_sigaction = on_tick;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  const int signal = SIGRTMIN + 3;
  if (sigaction(signal, &sa, nullptr) != 0) {
    std::perror("host_sampler: sigaction");
    return;
  }
  struct sigevent ev {};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = signal;
  ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (timer_create(CLOCK_MONOTONIC, &ev, &g_timer) != 0) {
    std::perror("host_sampler: timer_create");
    return;
  }
  const long ns = std::atol(us) * 1000;
  struct itimerspec every {};
  every.it_interval.tv_sec = ns / 1000000000;
  every.it_interval.tv_nsec = ns % 1000000000;
  every.it_value = every.it_interval;
  if (timer_settime(g_timer, 0, &every, nullptr) != 0) {
    std::perror("host_sampler: timer_settime");
    timer_delete(g_timer);
    return;
  }
  g_on = true;
  std::atexit(write_out);
}
}  // namespace
