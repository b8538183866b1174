#pragma once
// Note [Replay watchdog]
// A replayed graph that holds a group's collectives (dist/process_group.h) would hang the process
// when a peer died: its kernels wait on the GPU for data that never comes, and the next host call
// that waits for the device — a read of the loss, the next step's input copies — never returns.
// The group's ReplayWatchdog, a ReplayWatcher (Note [Watched replays], engine/runtime/capture_mode.h), is
// registered with every graph that captured one of the group's collectives. After each launch it
// records an event on the launch's stream; a thread of its own looks at the oldest launch not yet
// finished every 5 ms, and polls NCCL's asynchronous error. A launch has the group's
// collective_timeout_s to finish, counted from the launch or from when the launch before it
// finished (a launch queued behind a slow one is not charged for its wait). Past that, or on an
// NCCL error, the watchdog aborts the group: it marks it aborted with the reason — the rank, the
// graph, the replay's number — first, then aborts the communicator, which ends the stuck
// collectives (ncclCommAbort, bounded: on one machine it can wait for the other ranks). From then
// on the next launch of any graph holding the group's collectives is refused with that reason
// before anything is launched, as is the group's next call, and ProcessGroup::aborted() says why.
// A graph that outlives its group refuses to launch. The thread starts at the first watched launch,
// runs in relaxed capture mode (it queries events while other threads of the process capture),
// lets no exception escape, and ends with the group. What a watched launch costs the host: one
// event record and a lock (docs/RESULTS.md).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"

namespace graphward::dist {

class ReplayWatchdog final : public ReplayWatcher {
 public:
  // What the watchdog asks of its group (each may be called on the watchdog's thread).
  struct Group {
    std::function<void(const std::string& why)> abort;  // mark aborted with `why`, then abort
    std::function<std::string()> aborted;               // why it was aborted, "" while it works
    std::function<std::string()> async_error;  // NCCL's asynchronous error, "" if none (or busy)
  };
  ReplayWatchdog(int rank, Device device, double timeout_s, Group group);
  ~ReplayWatchdog() override;
  ReplayWatchdog(const ReplayWatchdog&) = delete;
  ReplayWatchdog& operator=(const ReplayWatchdog&) = delete;

  // The group is going: its thread stops (after a call to the group in flight), and every later
  // launch of a graph that watches it is refused.
  void detach() noexcept;
  // Refuses the launch once the group was aborted or is gone.
  void before_launch(const std::string& graph) override;
  void after_launch(void* stream, const std::string& graph) override;
  // Watched launches so far.
  std::uint64_t launches() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Launch {
    cudaEvent_t event;
    std::string graph;
    std::uint64_t replay;  // of this graph, from 1
    Clock::time_point launched;
  };
  void run() noexcept;
  // One look at the oldest launches: "" while all is well, else why the group must be aborted.
  std::string check(Clock::time_point now);

  const int rank_;
  const Device device_;
  const double timeout_s_;
  Group group_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Launch> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::string, std::uint64_t> replays_;  // launches of each graph
  std::uint64_t launches_ = 0;
  Clock::time_point last_finished_{};
  bool detached_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace graphward::dist
