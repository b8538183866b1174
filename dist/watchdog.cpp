#include "graphward/dist/watchdog.h"

#include <algorithm>
#include <exception>

#include "graphward/base/error.h"

namespace graphward::dist {

ReplayWatchdog::ReplayWatchdog(int rank, Device device, double timeout_s, Group group)
    : rank_(rank), device_(device), timeout_s_(timeout_s), group_(std::move(group)) {}

ReplayWatchdog::~ReplayWatchdog() {
  detach();
#if GRAPHWARD_HAS_CUDA
  // Events of launches still pending are destroyed too (the runtime frees each once it completes).
  for (const Launch& l : pending_) GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(l.event));
  for (cudaEvent_t e : free_events_) GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
#endif
}

void ReplayWatchdog::detach() noexcept {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    detached_ = true;
    stop_ = true;
    thread = std::move(thread_);
  }
  wake_.notify_all();
  if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) thread.join();
  if (thread.joinable()) thread.detach();
}

void ReplayWatchdog::before_launch(const std::string& graph) {
  std::unique_lock<std::mutex> lock(mutex_);
  GW_CHECK(!detached_, "ProcessGroup: rank ", rank_, ": ", graph,
           " holds collectives of a ProcessGroup that is gone; expected the graph to be "
           "launched while its group lives (capture it again with the new group)");
  const std::uint64_t next = replays_[graph] + 1;
  // The group's lock is taken under the watchdog's here only; the group never calls the watchdog
  // holding its own.
  const std::string why = group_.aborted();
  GW_CHECK(why.empty(), "ProcessGroup: rank ", rank_, ": replay ", next, " of ", graph,
           " refused: the group was aborted (", why,
           "); expected a new ProcessGroup on every rank, and the graph captured again with it");
}

void ReplayWatchdog::after_launch(void* stream, const std::string& graph) {
#if GRAPHWARD_HAS_CUDA
  std::lock_guard<std::mutex> lock(mutex_);
  cudaEvent_t event = nullptr;
  if (free_events_.empty()) {
    GW_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = free_events_.back();
    free_events_.pop_back();
  }
  const cudaError_t recorded = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  if (recorded != cudaSuccess) {
    free_events_.push_back(event);
    GW_CUDA_CHECK(recorded);
  }
  pending_.push_back({event, graph, ++replays_[graph], Clock::now()});
  ++launches_;
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
#else
  (void)stream, (void)graph;
#endif
}

std::uint64_t ReplayWatchdog::launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return launches_;
}

std::string ReplayWatchdog::check(Clock::time_point now) {
#if GRAPHWARD_HAS_CUDA
  while (!pending_.empty()) {
    Launch& l = pending_.front();
    const cudaError_t q = cudaEventQuery(l.event);
    if (q == cudaSuccess) {
      last_finished_ = now;
      free_events_.push_back(l.event);
      pending_.pop_front();
      continue;
    }
    if (q != cudaErrorNotReady) {
      return detail::concat("rank ", rank_, ": replay ", l.replay, " of ", l.graph,
                            " failed on the device (", cudaGetErrorName(q), ")");
    }
    const Clock::time_point from = std::max(l.launched, last_finished_);
    const double waited = std::chrono::duration<double>(now - from).count();
    if (waited > timeout_s_) {
      return detail::concat("rank ", rank_, ": replay ", l.replay, " of ", l.graph,
                            " did not finish within ", timeout_s_,
                            " s (collective_timeout_s: its collectives wait for a rank that "
                            "stopped, failed or runs something else)");
    }
    return "";
  }
#else
  (void)now;
#endif
  return "";
}

void ReplayWatchdog::run() noexcept {
  try {
#if GRAPHWARD_HAS_CUDA
    // Event queries while the process's other threads capture: relaxed, this thread only.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    GW_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    GW_CUDA_CHECK(cudaSetDevice(device_.index));
#endif
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(5));
      if (stop_) break;
      std::string why = check(Clock::now());
      if (why.empty() && !pending_.empty()) {
        const std::string where = detail::concat(" during replay ", pending_.front().replay, " of ",
                                                 pending_.front().graph);
        lock.unlock();
        const std::string error = group_.async_error();
        lock.lock();
        if (stop_) break;
        if (!error.empty()) why = detail::concat("rank ", rank_, ": NCCL reported ", error, where);
      }
      if (why.empty()) continue;
      lock.unlock();
      group_.abort(why);  // marks the group aborted first, then aborts NCCL (bounded)
      return;             // nothing launched from here on: refused by before_launch
    }
  } catch (const std::exception& e) {
    detail::log_error(__FILE__, __LINE__,
                      detail::concat("ProcessGroup: rank ", rank_, ": the replay watchdog stopped: ",
                                     e.what()));
  }
}

}  // namespace graphward::dist
