#include "graphward/engine/runtime/capture_mode.h"

#include <array>
#include <condition_variable>
#include <mutex>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/cuda.h"

namespace graphward {

namespace {
thread_local const std::string* t_capturing = nullptr;  // what the innermost scope captures
thread_local bool t_whole_step = false;
thread_local CaptureWatchers* t_watchers = nullptr;  // Note [Watched replays]
}  // namespace

CaptureWatchers::CaptureWatchers() : previous_(t_watchers) {
  t_watchers = this;
}
CaptureWatchers::~CaptureWatchers() {
  t_watchers = previous_;
}
void watch_this_capture(const std::shared_ptr<ReplayWatcher>& watcher) {
  if (!t_watchers || !watcher) return;
  for (const auto& w : t_watchers->watchers_) {
    if (w == watcher) return;
  }
  t_watchers->watchers_.push_back(watcher);
}

WholeStepScope::WholeStepScope() noexcept : previous_(t_whole_step) {
  t_whole_step = true;
}

WholeStepScope::~WholeStepScope() {
  t_whole_step = previous_;
}

bool in_whole_step() noexcept {
  return t_whole_step;
}

CaptureModeScope::CaptureModeScope(std::string what)
    : previous_(t_capturing), what_(std::move(what)) {
  t_capturing = &what_;
}

CaptureModeScope::~CaptureModeScope() {
  t_capturing = previous_;
}

bool capturing() noexcept {
  return t_capturing != nullptr;
}

const std::string* capture_name() noexcept {
  return t_capturing;
}

void check_capturable(const char* op) {
  GW_CHECK(t_capturing == nullptr, op, " cannot run while graphward is capturing ", *t_capturing,
           " into a CUDA graph: it waits for the GPU or reads a tensor's value on the host, which "
           "a graph cannot replay (the read would happen once, at capture time); move it out of "
           "the captured work (e.g. read the loss after backward() or StepGraph::run() returns)");
}

void check_launch_stream(const void* stream) {
  if (t_capturing == nullptr) return;
#if GRAPHWARD_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GW_CUDA_CHECK(
      cudaStreamIsCapturing(static_cast<cudaStream_t>(const_cast<void*>(stream)), &status));
  GW_CHECK(status == cudaStreamCaptureStatusActive, "an op was launched on stream ", stream,
           ", which is not part of the capture of ", *t_capturing, " (its capture status: ",
           status == cudaStreamCaptureStatusNone ? "not capturing" : "capture invalidated",
           "): its work would run once, now, and be missing from every replay. Expected: inside "
           "captured work, run ops on the capturing stream, or on a stream that first waits for "
           "it (Stream::wait_stream(the capturing stream)) and that it waits for before the step "
           "returns");
#else
  (void)stream;
#endif
}

// ---- Note [Device-wide waits and other threads' captures] -------------------------------------

namespace {
constexpr int kGatedDevices = 64;
struct DeviceGate {
  std::mutex mutex;
  std::condition_variable changed;
  int captures = 0;       // underway, on every thread
  int waits_pending = 0;  // device-wide waits waiting for the captures to end
  bool waiting = false;   // a device-wide wait is running
};
// Never destroyed: a thread's handles go at its exit, which may come after static destruction.
std::array<DeviceGate, kGatedDevices>& gates() {
  static auto* g = new std::array<DeviceGate, kGatedDevices>();
  return *g;
}
thread_local std::array<int, kGatedDevices> t_captures_here{};  // this thread's, per device
bool gated(int device) {
  return device >= 0 && device < kGatedDevices;
}
}  // namespace

detail::CaptureUnderway::CaptureUnderway(int device) : device_(device) {
  if (!gated(device)) return;
  DeviceGate& g = gates()[device];
  std::unique_lock<std::mutex> lock(g.mutex);
  // This thread's own capture underway (a nested one) must not wait for a wait that waits for it.
  if (t_captures_here[device] == 0) {
    g.changed.wait(lock, [&] { return !g.waiting && g.waits_pending == 0; });
  }
  ++g.captures;
  ++t_captures_here[device];
}

detail::CaptureUnderway::~CaptureUnderway() {
  if (!gated(device_)) return;
  DeviceGate& g = gates()[device_];
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    --g.captures;
    --t_captures_here[device_];
  }
  g.changed.notify_all();
}

detail::DeviceWideWait::DeviceWideWait(int device) noexcept : device_(device) {
  if (!gated(device) || t_captures_here[device] != 0) return;  // its own capture: not gated
  try {
    DeviceGate& g = gates()[device];
    std::unique_lock<std::mutex> lock(g.mutex);
    ++g.waits_pending;
    g.changed.wait(lock, [&] { return !g.waiting && g.captures == 0; });
    --g.waits_pending;
    g.waiting = true;
    holding_ = true;
  } catch (...) {
    // std::system_error from the mutex: the wait goes ahead ungated rather than not at all.
  }
}

detail::DeviceWideWait::~DeviceWideWait() {
  if (!holding_) return;
  DeviceGate& g = gates()[device_];
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.waiting = false;
  }
  g.changed.notify_all();
}

int detail::captures_underway(int device) noexcept {
  if (!gated(device)) return 0;
  DeviceGate& g = gates()[device];
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.captures;
}

}  // namespace graphward
