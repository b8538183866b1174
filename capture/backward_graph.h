#pragma once
// BackwardGraph: the backward of a repeated, fixed-shape training step, captured once into a CUDA
// graph and replayed every step (docs/DESIGN.md, "Capture and replay").
//
//   gw::BackwardGraph bw(dev);
//   for (step ...) {
//     gw::Tensor loss = model(batch);       // eager forward on your streams, recorded
//     bw.backward(loss);                    // warm-up, capture, replay, update: by itself
//   }
//
// Each backward():
//   1. computes the tape's signature (capture/signature.h) on the current stream S — from the
//      step's tape log, which the forward filled and compared with the last replayed tape as it
//      recorded it (Note [Tape log]), or by a walk of the tape when the log cannot stand for it;
//   2. asks the graph cache (capture/graph_cache.h): same signature -> replay; same structure with
//      other addresses -> capture again and update the cached executable in place
//      (cudaGraphExecUpdate; re-instantiated if the update is refused); a new structure -> capture
//      and cache a new executable (least recently used out). Never a stale replay;
//   3. capture: the eager executor runs the backward plan under thread-local stream capture from
//      S, each forward stream mapped onto a private capture stream that enters the capture by an
//      event of S (a fork, or its first wait on a step of S) and is joined back before it ends (the
//      legacy stream, or an earlier step's stream, cannot enter); backward intermediates are served
//      from a pool the executable owns, reused inside the graph where stream order allows (Note
//      [Graph memory pool]): kernel nodes only; ops that cannot be captured are refused by name
//      (Note [Capture-unsafe ops]);
//   4. replay: S waits where rule [read after write] needs it, found before any capture — on the
//      stream that produced the loss if another (the forward ordered everything the graph reads
//      before the loss), on the stream of the last launch if another, and on streams that used a
//      .grad the graph writes since its last write (an optimizer on a stream of its own); usually
//      on none.
//      Then the executable is launched on S; gradients are ready on S when backward() returns,
//      like the eager backward (rule [fork and join]). The step's saved tensors are released after
//      the launch, their memory ordered after S by one event (rule [reuse after use],
//      Storage::record_read), and dropped on a thread of the BackwardGraph's own (Note [Deferred
//      release], engine/tape/deferred_release.h).
//   5. input slots: a saved tensor that is a new tensor every step (the batch, the targets, ids, a
//      mask) is read by the graph from a slot of its own, refreshed before each launch, so that a
//      new batch does not change the graph (Note [Input slots]).
// The first `warmup` calls of each program — a backward that overwrites the .grads and one that
// adds to them are two (GradWrite) — run the eager backward (cuBLAS handles, workspaces and GEMM
// plans are made there, outside any capture). Counted per program so that each is captured in a
// step shaped as the steps after it: a warm-up's temporaries come from the step arena, and a
// program captured in the step of another's warm-up (the second micro-batch's, accumulating,
// after the first's) would read the tensors made after that warm-up at addresses they have only
// in that step, and be updated once the next step. Leaf gradients must persist for a graph to
// write them: a leaf whose .grad is undefined gets zeros before its first captured step.
//
// The CPU backend, and `force_eager`, run the eager backward every time (counted as eager).
//
// Threads: a BackwardGraph serves the thread that made it. Its tape log is that thread's, the
// cuBLAS and cuDNN handles its captures use are made in that thread's eager steps, and its seed,
// input slots and warm-up walk stand for that thread's steps: backward() or trace() from another
// thread is refused with an error naming both threads (it crashed), and one BackwardGraph a thread
// is the way to train on several (they may share parameters; Note [Leaves shared across threads],
// engine/backward/eager_executor.cpp). stats() and write_dot() may be called from any thread (every call
// takes a lock).
//
// Note [Input slots]
// A training loop hands the model a new batch tensor every step, at another address, and the
// graph's kernels point at the batch the capture saw (the first linear layer saves its input for
// the weight gradient; the loss saves the targets; an embedding its ids). Left alone, every step
// would update the executable: a capture of the whole backward and cudaGraphExecUpdate, several
// times the step's own host time. Instead the graph reads such a saved tensor from a slot: memory
// the executable owns, which the capture's kernels point at, refreshed before every launch by a
// device-to-device copy on the caller's stream — all of a step's slots in one kernel
// (capture::SlotRefresh) — ordered after the tensor's producer (Storage::sync_for_read) and
// recorded as a read of the tensor (its memory is reused only after the copy, rule [reuse after
// use]). The signature does not compare the slotted addresses (GraphCache's Entry::unbound); their
// shapes and dtypes are part of the structure, as always.
//   * Which: a saved tensor that entered the tape from outside — one of its op's inputs, with no
//     gradient, whose memory no recorded op produced (Node::saved_from_outside) — and whose
//     address at the first capture differs from the warm-up step's (the warm-up's tape is walked
//     for this); and, when a later step of a cached structure moves such a tensor, that one from
//     the update on (one update, then replays). A tensor that stays (a constant mask, a frozen
//     weight) is read in place, with no copy. An activation, an op's own saved buffer, a parameter
//     or a .grad that moves is an update, as before: inside a StepScope they keep their addresses
//     (Note [Step arena]).
//   * Places that save one tensor (the batch, read by the first layer of every branch) share one
//     slot; if a later step gives them different tensors, the executable is updated and they get
//     a slot each.
//   * Why a copy, not rebinding the kernels' pointers (cudaGraphExecKernelNodeSetParams): the
//     kernels of cuBLAS, cuBLASLt and cuDNN take the pointer inside parameter blocks whose layout
//     is theirs, not ours, and a pointer found by value could be a coincidence. A copy is exact,
//     and costs one kernel launch of host time for all the slots and bytes/bandwidth of device
//     time (a batch of a launch-bound model: well under a microsecond; docs/DECISIONS.md, "a new
//     batch every step: input slots refreshed by a copy").
//   * What the caller may keep: nothing is asked of it. The batch may be freed or overwritten
//     after backward() returns (the copy is ordered before any reuse of its memory); the slot
//     belongs to the graph, so an earlier step's batch is never read by a later replay.
//
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "graphward/base/config.h"

#include "graphward/capture/graph_cache.h"
#include "graphward/capture/graph_topology.h"
#include "graphward/capture/signature.h"
#include "graphward/engine/backward/backward.h"
#include "graphward/engine/backward/timeline.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/graph_pool.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/tape/deferred_release.h"

namespace graphward {

struct BackwardGraphOptions {
  std::size_t cache_capacity = 8;  // executables kept (least recently used out)
  int warmup = 1;                  // eager backwards of each program before its first capture
  bool force_eager = false;        // never capture (debugging, comparisons)
  // How every backward() of this BackwardGraph runs, the eager ones (the warm-up, force_eager)
  // and the captured one alike (engine/backward/backward.h): grad_write (what backward(loss) uses),
  // split_weight_grads, fuse_activation_epilogues, localize_faults (every backward() then runs
  // eagerly; also on with GRAPHWARD_LOCALIZE_FAULTS=1), check_finite_loss, reduce_gradients
  // (data parallelism: not owned, it must outlive the BackwardGraph), and streams (the eager
  // backwards'). Weight-gradient parallelism, unset, is on here: faster in every study and
  // bitwise equal (docs/DECISIONS.md, "weight-gradient parallelism on by default in the captured
  // backward"); the warm-up uses the same setting (it must: it initializes the side streams' GEMM
  // handles outside the capture). retain_graph and timings are refused: a replay releases its
  // step's saved tensors, and trace() times one.
  BackwardOptions backward = {};
};

// The shape of a captured graph.
struct GraphStats {
  std::size_t tape_nodes = 0;  // the tape nodes the backward reaches
  std::size_t kernel_nodes = 0;
  std::size_t other_nodes = 0;  // memsets, event nodes, ... (memory_nodes among them)
  std::size_t memory_nodes = 0;  // memory allocation and free nodes (none: Note [Graph memory pool])
  std::size_t memory_bytes = 0;  // the graph's own memory: its intermediates' pool
  std::size_t edges = 0;
  std::size_t streams = 0;  // the caller's stream and one private stream per other forward stream
  std::size_t forks = 0;    // the plan's: streams forked from the caller's
  std::size_t joins = 0;    // the plan's: streams joined back into it
  std::size_t input_slots = 0;       // tensors read from a slot (Note [Input slots]): copies a step
  std::size_t input_slot_bytes = 0;  // what the slots hold: copied before every launch
  capture::Topology topology;  // the graph's own: roots, sinks, fork and join nodes, longest path
};

// Host time of the last backward() that replayed, in microseconds.
struct BackwardHostTimes {
  double signature_us = 0;  // this step's tape signature
  // the waits rule [read after write] needs (usually none) and finding them
  double wait_us = 0;
  double decide_us = 0;     // the cache lookup (and, when it happens, capture or update)
  double refresh_us = 0;    // copying this step's tensors into the input slots (Note [Input slots])
  double launch_us = 0;     // the graph launch
  double release_us = 0;    // after the launch: recording the uses, handing the saved tensors off
  // The step's saved tensors were released as a whole (Note [Reads of a replayed step],
  // engine/runtime/memory.h), not node by node.
  bool whole_step = false;
  double before_launch_us() const {
    return signature_us + wait_us + decide_us + refresh_us + launch_us;
  }
  double total_us() const { return before_launch_us() + release_us; }
};

// What a BackwardGraph has done so far, and what its last graph backward (one that captured,
// updated or replayed) did: BackwardGraph::stats().
struct BackwardGraphStats {
  capture::GraphCacheCounters counters;  // captures, updates, replays, evictions
  std::uint64_t eager_backwards = 0;     // backward() calls that ran eagerly (warm-up, CPU, ...)
  // Graph backwards whose signature came from the step's tape log (Note [Tape log]) rather than a
  // walk of the tape.
  std::uint64_t log_signatures = 0;
  std::size_t cached_graphs = 0;  // executables in the cache
  // The last graph backward: whether its signature came from the tape log; whether its forward
  // matched the replayed tape node for node as it recorded it (the check before the launch then
  // compared only leaves, seeds, roots, mode and addresses); why its signature walked the tape
  // (nullptr when it came from the log).
  bool signature_from_log = false;
  bool matched_in_forward = false;
  const char* walk_reason = nullptr;
  std::string reason;      // why the last capture or update happened ("" before the first)
  GraphStats graph;        // the graph it replayed (zeros before the first capture)
  BackwardHostTimes host;  // where its host time went (zeros before the first)
};

class BackwardGraph {
 public:
  explicit BackwardGraph(Device device, BackwardGraphOptions options = {});
  ~BackwardGraph();
  BackwardGraph(const BackwardGraph&) = delete;
  BackwardGraph& operator=(const BackwardGraph&) = delete;

  // The backward of the scalar `loss` on the current stream of its device (see above), writing
  // the .grads as options.backward.grad_write says, or as `grad_write` says.
  void backward(const Tensor& loss) { backward(loss, options_.backward.grad_write); }
  void backward(const Tensor& loss, GradWrite grad_write);

  // What this BackwardGraph has done, and what its last graph backward did (BackwardGraphStats).
  BackwardGraphStats stats() const;
  // Writes the last captured graph as Graphviz DOT to `path` (cudaGraphDebugDotPrint).
  void write_dot(const std::string& path) const;

  // An instrumented replay (Note [Timeline]): the backward of `loss` captured the way backward()
  // captures it, with a timing-event node before and after every step (and its side part),
  // launched once and synchronized; returns each step's start and end on its stream (host_us 0).
  // The step's backward runs for real (the .grads are written, the saved tensors released, as by
  // backward()), but the cache and the counters are neither used nor changed: it captures and
  // instantiates every call, for inspection. Write it out with write_chrome_trace(path, steps,
  // trace_stream_names(), ...). CUDA only; not inside a capture.
  std::vector<StepTiming> trace(const Tensor& loss) {
    return trace(loss, options_.backward.grad_write);
  }
  std::vector<StepTiming> trace(const Tensor& loss, GradWrite grad_write);
  // The names of the streams of the last trace()'s plan (stream_names in engine/backward/timeline.h).
  const std::vector<std::string>& trace_stream_names() const { return trace_stream_names_; }

  struct Executable;  // the owners of a cudaGraph_t and its cudaGraphExec_t (backward_graph.cpp)
  using Cache = capture::GraphCache<std::shared_ptr<Executable>>;
  // Note [Input slots]: a saved tensor the graph reads from a copy of its own, refreshed before
  // every launch. `address` is the saved tensor's place in the signature's addresses, `node` its
  // node's in the signature's nodes, `saved` its index among the node's saved tensors.
  struct InputSlot {
    std::uint32_t address = 0, node = 0, saved = 0;
    // The slot whose copy this one shares (its own index if none): saved places that read one
    // tensor at the capture read one copy of it.
    std::uint32_t leader = 0;
    Tensor copy;  // graph-owned memory (not the step arena's, not the block cache's)
  };

 private:
  void eager(const Tensor& loss, GradWrite grad_write);
  void check_loss(const Tensor& loss, const char* what) const;
#if GRAPHWARD_HAS_CUDA
  void ensure_seed(const Tensor& loss, cudaStream_t caller);
  // Maps the plan's streams other than the caller's onto this BackwardGraph's capture streams.
  void use_capture_streams(BackwardPlan& plan);
  // Runs `plan` under a thread-local stream capture of `caller`, intermediates from `pool`
  // (timed: with timing-event nodes, EagerExecutor::run_timed_in_capture); returns the graph.
  cudaGraph_t capture_plan(const BackwardPlan& plan, cudaStream_t caller, GraphMemoryPool& pool,
                           bool timed, std::vector<std::shared_ptr<ReplayWatcher>>* watchers);
  // Rule [read after write] before a launch on `caller`: waits for the loss's stream, the last
  // launch's stream and (scan_grads) every other user of the leaves' .grads since their last write.
  void order_before_launch(const Tensor& loss, cudaStream_t caller,
                           const std::vector<Tensor>& leaves, bool scan_grads);
  // Note [Input slots]: the slots a capture of this step's tape gives its graph (`updating`: the
  // entry of the same structure being updated, else null), their memory made and filled and the
  // saved tensors substituted (fill_slots), and refreshed before each replay (refresh_slots).
  std::vector<InputSlot> choose_slots(const Cache::Entry* updating, GradWrite grad_write);
  // This step's tensor that `slot` stands for (its node's saved tensor).
  const Tensor& slot_source(const InputSlot& slot) const;
  void fill_slots(Executable& exec, cudaStream_t caller);
  void refresh_slots(const Executable& exec, cudaStream_t caller);
  // backward()'s parts, in order. Whether this step's signature replays a cached graph, or what
  // must be captured or updated (the reached leaves given their .grads first).
  Cache::Decision decide(cudaStream_t caller, GradWrite grad_write);
  // Note [Backwards sharing a tape] (engine/tape/autograd.cpp): claims the nodes the backward of
  // `decision` reaches, before anything reads them.
  void claim_reached(NodeClaims& claims, const Cache::Decision& decision);
  // The capture or update `decision` asks for: the executable to launch.
  std::shared_ptr<Executable> capture_or_update(Cache::Decision& decision, const Tensor& loss,
                                                cudaStream_t caller, GradWrite grad_write);
  // After the launch: the graph's reads and writes recorded, the step's saved tensors released;
  // whether as a whole (BackwardHostTimes::whole_step).
  bool record_and_release(const Executable& exec, cudaStream_t caller);
#endif
  // Gives each leaf without a .grad a zero one; whether it made any.
  bool make_missing_grads(const std::vector<Tensor>& leaves);
  void backward_locked(const Tensor& loss, GradWrite grad_write);
  // Throws naming both threads unless called on owner_ (see Threads above).
  void check_thread(const char* what) const;
  mutable std::mutex mutex_;  // every public call holds it (see Threads above)
  std::thread::id owner_ = std::this_thread::get_id();  // the thread that made it
  Device device_;
  BackwardGraphOptions options_;
  bool localize_ = false;  // options_.backward.localize_faults or GRAPHWARD_LOCALIZE_FAULTS
  bool split_ = true;      // options_.backward.split_weight_grads, resolved
  Cache cache_;
  std::vector<std::unique_ptr<Stream>> capture_streams_;
  EagerExecutor executor_;
  Tensor seed_;  // the static seed gradient (a one), made on the caller's stream
  std::uint64_t eager_ = 0;
  std::uint64_t calls_ = 0;
  std::array<std::uint64_t, 2> program_calls_{};  // calls of each program, by GradWrite
  std::string last_reason_;
  GraphStats last_stats_;
  BackwardHostTimes host_;
  std::vector<Event> wait_events_;             // the caller's waits before a launch
  std::vector<cudaStream_t> extra_waited_;     // the streams waited on this step (scratch)
  cudaStream_t last_launch_stream_ = nullptr;  // where the last graph was launched
  std::uint64_t hazards_seen_ =
      ~std::uint64_t{0};  // detail::watched_hazard_epoch() at the last scan
  // Note [Writes of a replayed graph] (engine/runtime/memory.h): what the .grads written by the last
  // replay follow, and which of the signature's leaves they are (empty: none follow it).
  std::shared_ptr<detail::GraphWrites> grad_writes_;
  std::vector<std::uint32_t> grad_writes_leaves_;
  std::shared_ptr<Executable> last_captured_;
  capture::TapeSignature signature_;  // this step's, computed into the same buffers every step
  capture::TapeSignature walk_;       // a walk of this step's tape, when capturing
  // A walk of each program's last warm-up's tape, by GradWrite (Note [Input slots]).
  std::array<capture::TapeSignature, 2> warm_;
  std::vector<Tensor> slot_sources_;  // this step's tensors copied into slots (until the launch)
  std::vector<SavedTensor> hand_off_;  // the step's saved tensors, for releaser_ (its buffer)
  detail::ReleaseWorker releaser_;     // Note [Deferred release]
  std::vector<Tensor> roots_, seeds_;
  std::uint64_t log_signatures_ = 0;
  bool last_from_log_ = false;
  bool last_matched_in_forward_ = false;
  std::thread::id armed_on_;          // the thread whose tape log this BackwardGraph armed
  std::vector<std::string> trace_stream_names_;
};

}  // namespace graphward
