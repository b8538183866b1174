#include "graphward/engine/tape/deferred_release.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <utility>

#include "graphward/base/error.h"

namespace graphward::detail {

// Note [Waking the release worker]
// A hand-off that wakes a sleeping worker costs the caller a system call (a futex wake), which was
// most of what a replayed backward's release cost after the launch (docs/DECISIONS.md, "the
// release worker spins for 2 ms after a release before it sleeps"). So the two sides meet on an
// atomic flag (`pending`) and sleep only when waiting is long:
//   * the worker, after a release, spins on the flag for up to kWorkerSpin before it sleeps on a
//     condition variable; a training loop hands it the next step within that window, and then the
//     hand-off is one store (no lock, no system call). A worker asleep is woken through the mutex
//     and the condition variable, as before;
//   * a caller that must wait for the release in flight (the next StepScope, the next hand-off)
//     spins for up to kCallerSpin first, then sleeps until the worker says it is done.
// Neither side misses the other: each publishes "I am asleep / I am waiting" (`asleep`,
// `waiters`) before it checks the flag under the mutex, and the other side changes the flag before
// it reads that, so one of the two sees the other's write (all sequentially consistent). The spin
// takes a core only for a window after each release, and not at all on a host with fewer than 4
// hardware threads, where it would take the caller's.
namespace {
constexpr auto kWorkerSpin = std::chrono::microseconds(2000);
constexpr auto kCallerSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool spinning_pays() {
  static const bool pays = std::thread::hardware_concurrency() >= 4;
  return pays;
}

// Spins until `done()` or `window` passed; whether done.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds window) {
  if (!spinning_pays()) return done();
  const auto end = std::chrono::steady_clock::now() + window;
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= end) return done();
  }
}
}  // namespace

struct ReleaseWorker::State {
  // While `pending`, the buffers below belong to the worker; otherwise to the thread handing over.
  std::atomic<bool> pending{false};  // a release handed over and not finished
  std::atomic<bool> stop{false};
  std::atomic<bool> asleep{false};  // the worker sleeps on `work`
  std::atomic<int> waiters{0};      // threads asleep (or about to be) on `done`
  std::mutex mutex;                 // only for sleeping and waking
  std::condition_variable work, done;
  // The release in flight; the worker empties them in place (their capacity kept), and the next
  // hand-off swaps them for the caller's.
  std::vector<SavedTensor> saved;
  std::vector<Node*> nodes;  // release_step's
  std::vector<Tensor> tensors;
  Tensor keep;
  std::function<void()> before;
  std::thread thread;

  bool has_work() const { return pending.load() || stop.load(); }

  void await_work() {
    if (spin_until([this] { return has_work(); }, kWorkerSpin)) return;
    std::unique_lock<std::mutex> lock(mutex);
    asleep.store(true);
    work.wait(lock, [this] { return has_work(); });
    asleep.store(false);
  }

  void wake_worker() {
    if (!asleep.load()) return;
    { std::lock_guard<std::mutex> lock(mutex); }  // the worker is asleep, or sees the flag
    work.notify_one();
  }

  void await_done() {
    if (spin_until([this] { return !pending.load(); }, kCallerSpin)) return;
    waiters.fetch_add(1);
    {
      std::unique_lock<std::mutex> lock(mutex);
      done.wait(lock, [this] { return !pending.load(); });
    }
    waiters.fetch_sub(1);
  }

  void run() {
    for (;;) {
      await_work();
      if (!pending.load()) return;  // stopped, nothing left
      if (before) before();
      before = nullptr;
      for (Node* n : nodes) n->drop_saved_of_replayed_step();
      saved.clear();
      tensors.clear();
      keep = Tensor();
      nodes.clear();
      pending.store(false);  // the buffers are the caller's again
      if (waiters.load() > 0) {
        { std::lock_guard<std::mutex> lock(mutex); }  // a waiter is asleep, or sees the flag
        done.notify_all();
      }
    }
  }
};

namespace {
// The states this thread handed releases to (wait_for_releases).
thread_local std::vector<std::shared_ptr<ReleaseWorker::State>> t_handed;
}  // namespace

ReleaseWorker::ReleaseWorker() : state_(std::make_shared<State>()) {}

ReleaseWorker::~ReleaseWorker() {
  state_->stop.store(true);  // the loop finishes a pending release first
  { std::lock_guard<std::mutex> lock(state_->mutex); }
  state_->work.notify_all();
  if (state_->thread.joinable()) {
    try {
      state_->thread.join();
    } catch (const std::exception& e) {
      log_error(__FILE__, __LINE__, e.what());
    }
  }
}

void ReleaseWorker::release(std::vector<SavedTensor>& saved, Tensor keep,
                            std::function<void()> before) {
  std::vector<Node*> no_nodes;
  std::vector<Tensor> no_tensors;
  hand(saved, no_nodes, no_tensors, std::move(keep), std::move(before));
}

void ReleaseWorker::release_step(std::vector<Node*>& nodes, std::vector<Tensor>& tensors,
                                 Tensor keep) {
  std::vector<SavedTensor> no_saved;
  hand(no_saved, nodes, tensors, std::move(keep), {});
}

void ReleaseWorker::hand(std::vector<SavedTensor>& saved, std::vector<Node*>& nodes,
                         std::vector<Tensor>& tensors, Tensor keep, std::function<void()> before) {
  State& st = *state_;
  st.await_done();  // one release in flight at a time
  if (!st.thread.joinable()) {
    try {
      st.thread = std::thread([state = state_] { state->run(); });
    } catch (const std::exception& e) {
      log_error(__FILE__, __LINE__,
                std::string("ReleaseWorker: no thread (") + e.what() +
                    "); the saved tensors are released on the caller's thread");
      if (before) before();
      for (Node* n : nodes) n->drop_saved_of_replayed_step();
      nodes.clear();
      saved.clear();
      tensors.clear();
      return;
    }
  }
  std::swap(st.saved, saved);  // the caller gets the last release's buffers, empty
  std::swap(st.nodes, nodes);
  std::swap(st.tensors, tensors);
  st.keep = std::move(keep);
  st.before = std::move(before);
  st.pending.store(true);  // the buffers are the worker's now
  st.wake_worker();
  if (std::find(t_handed.begin(), t_handed.end(), state_) == t_handed.end()) {
    t_handed.push_back(state_);
  }
}

void wait_for_releases() {
  for (const std::shared_ptr<ReleaseWorker::State>& st : t_handed) st->await_done();
  t_handed.clear();
}

}  // namespace graphward::detail
