#include "engine/deferred_release.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "engine/error.h"

namespace graphward::detail {

struct ReleaseWorker::State {
  std::mutex mutex;
  std::condition_variable work, done;
  std::vector<SavedTensor> saved, spare;  // the release in flight; the buffer to hand back
  Tensor keep;
  std::function<void()> before;
  bool pending = false;  // a release handed over and not finished
  bool stop = false;
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work.wait(lock, [this] { return pending || stop; });
      if (!pending) return;
      std::vector<SavedTensor> dropping = std::move(saved);
      saved.clear();
      Tensor kept = std::move(keep);
      std::function<void()> first = std::move(before);
      before = nullptr;
      lock.unlock();
      if (first) first();
      dropping.clear();  // the destructors: outside the lock
      kept = Tensor();
      lock.lock();
      spare = std::move(dropping);  // empty, its capacity kept
      pending = false;
      done.notify_all();
    }
  }
};

namespace {
// The states this thread handed releases to (wait_for_releases).
thread_local std::vector<std::shared_ptr<ReleaseWorker::State>> t_handed;

void wait_state(ReleaseWorker::State& st) {
  std::unique_lock<std::mutex> lock(st.mutex);
  st.done.wait(lock, [&st] { return !st.pending; });
}
}  // namespace

ReleaseWorker::ReleaseWorker() : state_(std::make_shared<State>()) {}

ReleaseWorker::~ReleaseWorker() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;  // the loop finishes a pending release first
  }
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
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.mutex);
  st.done.wait(lock, [&st] { return !st.pending; });  // one release in flight at a time
  if (!st.thread.joinable()) {
    try {
      st.thread = std::thread([state = state_] { state->run(); });
    } catch (const std::exception& e) {
      lock.unlock();
      log_error(__FILE__, __LINE__, std::string("ReleaseWorker: no thread (") + e.what() +
                                        "); the saved tensors are released on the caller's thread");
      if (before) before();
      saved.clear();
      return;
    }
  }
  std::swap(st.saved, saved);
  saved = std::move(st.spare);
  saved.clear();
  st.keep = std::move(keep);
  st.before = std::move(before);
  st.pending = true;
  lock.unlock();
  st.work.notify_one();
  if (std::find(t_handed.begin(), t_handed.end(), state_) == t_handed.end()) {
    t_handed.push_back(state_);
  }
}

void wait_for_releases() {
  for (const std::shared_ptr<ReleaseWorker::State>& st : t_handed) wait_state(*st);
  t_handed.clear();
}

}  // namespace graphward::detail
