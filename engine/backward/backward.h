#pragma once
// backward(): plans the backward of the roots from the tape (engine/backward/backward_plan.h) and runs the
// plan eagerly with the EagerExecutor, by the stream contract of docs/DESIGN.md:
//   * each node runs on the stream its forward ran on (rule [forward stream]), waiting on events
//     only where the plan says (rule [cross-stream gradients]) — or, where the backward is too
//     short on the GPU for streams to pay off, every node on S (Note [Streams of an eager
//     backward], engine/backward/backward_plan.h);
//   * every stream used first waits on the caller's stream S — the current stream when backward()
//     is called — so the seeds and anything enqueued on S before the call are visible (a fork
//     event, or the stream's first wait when that is on a step of S already); before
//     backward() returns, S waits on every stream used, so gradients are safe to read on S with no
//     further synchronization (rule [fork and join]). Work on other streams that touches .grad must
//     be ordered before S by the caller (Note [Planned synchronization] in memory.h);
//   * leaf gradients are written on the stream of the node that produces them (rule [leaf
//     gradients]).
// One thread; no worker pools.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/backward/backward_plan.h"
#include "graphward/engine/runtime/stream.h"

namespace graphward {

// One step of a timed backward: when it started and ended on its stream, in milliseconds since
// the backward began on the caller's stream (CUDA timing events around the step), and the host
// time the executor spent issuing it (its waits, gradient sums, the node's backward and its event).
struct StepTiming {
  int step;
  int stream;  // index into the plan's streams (0: the caller's)
  std::string label;
  float start_ms;
  float end_ms;
  double host_us = 0;
  // Weight-gradient parallelism: the step's leaf gradients on a side stream (plan index), timed
  // apart; -1 when the step has no side part.
  int side_stream = -1;
  float side_start_ms = 0;
  float side_end_ms = 0;
};

// Note [Gradient reduction]
// Data parallelism: every process computes the gradients of its part of the batch, and a reducer
// replaces each leaf gradient with its average over the processes (dist::ProcessGroup, NCCL). The
// executor hands it the leaf gradients bucket by bucket (Note [Gradient buckets],
// engine/backward/backward_plan.h) as soon as a bucket's last gradient is written: the reducer's stream
// waits on an event of each producing stream, the reduction runs there while the rest of the
// backward goes on, and the caller's stream waits on the reducer's stream before backward()
// returns (rule [fork and join]). The same code runs eagerly and under capture (a BackwardGraph or
// a StepGraph captures the reductions into its graph). Every process must reduce the same buckets
// in the same order: before its first reduction of a bucket layout not seen before, the executor
// asks the reducer to check that every process has that layout (agree); inside a capture such a
// check cannot run (it synchronizes), so a layout never agreed before is refused there.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // The most bytes a bucket collects before it is reduced (the last may hold less), and the first
  // bucket's (smaller, so that the first reduction starts early; 0: bucket_bytes()).
  virtual std::size_t bucket_bytes() const = 0;
  virtual std::size_t first_bucket_bytes() const { return 0; }
  // The stream the reductions are issued on (nullptr on the CPU).
  virtual cudaStream_t stream() const = 0;
  // Throws a graphward::Error unless every process reduces buckets of this layout (a hash and a
  // readable description of this process's buckets). May synchronize. `in_capture`: called from
  // inside a capture, where only an already agreed layout may pass.
  virtual void agree(std::uint64_t layout, const std::string& description, bool in_capture) = 0;
  // Issues the in-place average over the processes of `grads` (one bucket) on stream(), after the
  // executor ordered stream() after their writers.
  virtual void reduce(const std::vector<Tensor>& grads) = 0;
  // Called outside a capture right before a bucket's reduce(), with the bucket's leaves' .grad
  // slots (every one defined, final, and stream() ordered after its writers): the reducer may
  // replace each with a tensor of the same shape, dtype and values in memory of its choosing,
  // which the next backwards write in place — e.g. one flat buffer a bucket, reduced with no
  // copies (Note [Gradients in buckets], dist/process_group.h). The default keeps them.
  virtual void place(const std::vector<Tensor*>& grads) { (void)grads; }
  // Called at the start of each backward that reduces, before anything is issued: the factor the
  // executor multiplies the seeds by, so that every gradient comes out multiplied by it (1:
  // none). A reducer that sums its buckets instead of averaging them returns 1/world size
  // (Note [Summed reductions], dist/process_group.h); the default keeps the seeds.
  virtual double begin_backward(GradWrite grad_write) {
    (void)grad_write;
    return 1.0;
  }
};

namespace detail {
// FNV-1a over `n` bytes, continuing from `h`.
inline constexpr std::uint64_t kFnvOffset = 1469598103934665603ull;
std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = kFnvOffset);
// A tensor's dtype, rank and shape mixed into `h`: the layouts the processes of a data-parallel
// group agree on (Note [Gradient reduction]).
std::uint64_t hash_layout(const Tensor& t, std::uint64_t h);
}  // namespace detail

// Which streams an eager backward runs on (Note [Streams of an eager backward],
// engine/backward/backward_plan.h). kAuto: the forward's (rule [forward stream]), unless the backward's
// device work is estimated too short to overlap anything, then the caller's stream alone. kForward:
// always the forward's.
enum class EagerStreams : std::uint8_t { kAuto, kForward };

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors for another backward through the same graph
  GradWrite grad_write = GradWrite::kAccumulate;
  // When set (CUDA only), every step is timed with events and the trace is stored here. Costs two
  // event records a step and a synchronize at the end: for inspection, not for training.
  std::vector<StepTiming>* timings = nullptr;
  // Weight-gradient parallelism (PlanOptions::split_weight_grads): leaf gradients of layers on
  // the critical path run on side streams. Unset: the default of where it runs — off for an eager
  // backward() (host-bound, where its extra events cost more than they give); on for a backward()
  // in a StepGraph's step, its warm-up and its capture (WholeStepScope, engine/runtime/capture_mode.h: a
  // replay pays no host cost for the streams), and for a BackwardGraph (BackwardGraphOptions,
  // capture/backward_graph.h). Inside a capture whose side streams have no cuBLAS handle yet (no
  // split run before it on this thread), the backward runs unsplit: a capture cannot make one.
  std::optional<bool> split_weight_grads = std::nullopt;
  // PlanOptions::fuse_activation_epilogues (Note [Backward epilogue fusion], engine/ops/ops.h).
  bool fuse_activation_epilogues = true;
  // Note [Streams of an eager backward] (engine/backward/backward_plan.h). CUDA only; a backward inside a
  // capture keeps the forward's streams.
  EagerStreams streams = EagerStreams::kAuto;
  // Note [Kernel faults] (base/error.h): synchronizes after every node (and before the first)
  // and reports a failing one by name — "the backward of linear#12 (step 3 of 9, stream 1)". For
  // finding a fault, not for training: one synchronize a node. Also turned on for every backward
  // by the environment variable GRAPHWARD_LOCALIZE_FAULTS=1 (localize_faults_from_env()). CUDA
  // only (the CPU backend reports its errors where they happen); not inside a capture.
  bool localize_faults = false;
  // Note [Non-finite loss]: reads every root on the host before anything is planned or written
  // and refuses a root with a NaN or an infinity, leaving the .grads as they were. One
  // synchronize of the roots' stream a backward; not inside a capture.
  bool check_finite_loss = false;
  // Note [Gradient reduction]: the leaf gradients averaged over the processes of a data-parallel
  // group, bucket by bucket while the backward runs. Not owned; nullptr: no reduction.
  GradientReducer* reduce_gradients = nullptr;
};

// Whether GRAPHWARD_LOCALIZE_FAULTS turns fault localization on (base/env.h: 1, true, on or yes;
// read once; a value that is no switch is an Error naming the variable).
bool localize_faults_from_env();
// Note [Non-finite loss]: throws a graphward::Error naming `what` (e.g. "backward") and the
// root when a root holds a NaN or an infinity. Reads the roots on the host (a synchronize);
// refused inside a capture.
void check_finite_roots(const char* what, const std::vector<Tensor>& roots);

// Backward of several roots. `seeds` are the gradients of the roots (same shapes); when empty,
// every root must have one element and its seed is 1.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds = {},
              BackwardOptions options = {});
inline void backward(const Tensor& root, BackwardOptions options = {}) {
  backward(std::vector<Tensor>{root}, {}, options);
}

// The plan backward() would run for these roots on the current stream (for inspection and tests),
// on the forward's streams: backward() may then move it onto the caller's (Note [Streams of an
// eager backward], engine/backward/backward_plan.h).
BackwardPlan plan_for(const std::vector<Tensor>& roots,
                      GradWrite grad_write = GradWrite::kAccumulate, PlanOptions options = {});

// Launches plans. Owns its events; one thread at a time.
class EagerExecutor {
 public:
  EagerExecutor() = default;
  EagerExecutor(const EagerExecutor&) = delete;
  EagerExecutor& operator=(const EagerExecutor&) = delete;

  // Runs `plan` with `seeds` (one per root; undefined for none). Device is that of the plan's
  // nodes. With `timings`, also times every step (see BackwardOptions::timings). With
  // `release_saved` (a backward without retain_graph), each node's saved tensors are freed right
  // after its step; if a step throws, the nodes before it are already released, and the error
  // says so (Note [A failed backward], failed_backward.cpp).
  // With `localize` (BackwardOptions::localize_faults), synchronizes after each step and throws
  // a CudaError naming the step's node when its work failed.
  // With `reducer`, the leaf gradients are reduced bucket by bucket (Note [Gradient reduction]).
  void run(const BackwardPlan& plan, const std::vector<Tensor>& seeds, Device device,
           std::vector<StepTiming>* timings = nullptr, bool release_saved = false,
           bool localize = false, GradientReducer* reducer = nullptr);

  // A timed run with a reducer also times each bucket's reduction: read_timings() returns them
  // after the steps (step = plan size + bucket) on the track past the plan's streams.
  // The timed run for a capture (BackwardGraph::trace): records the timing events as graph nodes
  // (Event::record_external) and reads nothing; after the graph ran and finished,
  // read_timings() returns the trace of that replay. No other run() may come in between.
  void run_timed_in_capture(const BackwardPlan& plan, const std::vector<Tensor>& seeds,
                            Device device, GradientReducer* reducer = nullptr);
  std::vector<StepTiming> read_timings(const BackwardPlan& plan, Device device);

  // Whether every side stream `plan` asks of this executor exists with its cuBLAS handle (made by
  // an earlier run outside a capture): a capture cannot make them.
  bool side_streams_ready(const BackwardPlan& plan, Device device) const;

 private:
  // kEager: run(), also what a capture records; kEagerReleasing: run() freeing each node's saved
  // tensors after its step; kInCapture: run_timed_in_capture (its timing events nodes of the
  // graph; no leaf claimed, nothing cached at the join, nothing undone).
  enum class RunKind : std::uint8_t { kEager, kEagerReleasing, kInCapture };
  struct Run;       // one run's state, and how it runs each instruction (eager_executor.cpp)
  class Observer;   // what a run adds around its instructions: its timing, its fault checks
  class Timing;
  class Localize;
  void run_impl(const BackwardPlan& plan, const std::vector<Tensor>& seeds, Device device,
                RunKind kind, GradientReducer* reducer, std::span<Observer* const> observers);
  // Note [A failed backward]: called from a catch block; joins, undoes, rethrows with an account.
  [[noreturn]] static void fail_backward(const BackwardPlan& plan, int reached, bool release_saved,
                                         const std::vector<std::pair<int, bool>>& leaf_had_grad,
                                         const std::function<void()>& join);
  Event& event(Device device, int i);
  Event& timing_event(Device device, int i);
  cudaStream_t side_stream(Device device, int i);  // for the plan's side stream index i
  std::vector<Event> events_, timing_events_;
  std::vector<double> host_us_;  // per step, of the last timed run
  // Per bucket of the last timed run: its gradients and bytes (Note [Gradient reduction]).
  std::vector<std::pair<std::size_t, std::size_t>> timed_buckets_;
  std::vector<Stream> side_streams_;
  Device events_device_ = Device::cpu();
};

}  // namespace graphward
