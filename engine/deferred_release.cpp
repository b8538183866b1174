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
  std::vector<Node*> nodes, spare_nodes;    // release_step's
  std::vector<Tensor> tensors, spare_tensors;
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
      std::vector<Node*> replayed = std::move(nodes);
      nodes.clear();
      std::vector<Tensor> handles = std::move(tensors);
      tensors.clear();
      Tensor kept = std::move(keep);
      std::function<void()> first = std::move(before);
      before = nullptr;
      lock.unlock();
      if (first) first();
      // The destructors: outside the lock.
      for (Node* n : replayed) n->drop_saved_of_replayed_step();
      dropping.clear();
      handles.clear();
      kept = Tensor();
      replayed.clear();
      lock.lock();
      spare = std::move(dropping);  // empty, its capacity kept
      spare_nodes = std::move(replayed);
      spare_tensors = std::move(handles);
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
      for (Node* n : nodes) n->drop_saved_of_replayed_step();
      nodes.clear();
      saved.clear();
      tensors.clear();
      return;
    }
  }
  std::swap(st.saved, saved);
  saved = std::move(st.spare);
  saved.clear();
  std::swap(st.nodes, nodes);
  nodes = std::move(st.spare_nodes);
  nodes.clear();
  std::swap(st.tensors, tensors);
  tensors = std::move(st.spare_tensors);
  tensors.clear();
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
