#pragma once
// BackwardPlan: what a backward will do, as plain host data — no CUDA call is made to build it.
// The eager executor launches it; BackwardGraph (capture/) turns the same plan into a CUDA graph,
// so eager and replayed backward cannot drift apart.
//
// A plan lists the nodes to run in a valid order with the stream of each (the stream its forward
// ran on, rule [forward stream]); every cross-stream wait as an explicit (producer step, consumer
// step, event) record (rule [cross-stream gradients]); the streams forked from the caller's stream
// at the start (those whose first step does not already wait for a step of the caller's stream) and
// joined back at the end (rule [fork and join]); for every gradient buffer where it is written and
// accumulated (rules [cross-stream gradients] and [leaf gradients]) and its first and last use.
// Note [Gradient buffers] in backward_plan.cpp says how contributions are routed.
//
// Waits are minimal: a stream that already waited on a later step of the producer's stream
// (directly or through another stream) gets no second wait — a vector clock per stream tracks what
// each stream has seen.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graphward/engine/runtime/device.h"
#include "graphward/engine/tape/autograd.h"

namespace graphward {

// How a backward writes parameter (leaf) gradients: added to .grad, or the first contribution of
// this backward overwrites .grad (then later ones add).
enum class GradWrite : std::uint8_t { kAccumulate, kOverwrite };
// Whether `g` is one of GradWrite's names (an enum can hold any value of its type).
constexpr bool is_valid(GradWrite g) {
  return static_cast<std::uint8_t>(g) <= static_cast<std::uint8_t>(GradWrite::kOverwrite);
}

// A root of a backward: the node that produced the root tensor, or the root itself when it is a
// leaf.
struct PlanRoot {
  std::shared_ptr<Node> node;
  Tensor leaf;
};

struct BackwardPlan {
  enum class BufferKind : std::uint8_t {
    kGrad,    // the gradient of a node's output, consumed by that node's step
    kStaged,  // a contribution produced on another stream, added into a kGrad buffer by its owner
    kLeaf,    // a leaf's persistent .grad
  };
  static constexpr int kSeed = -1;  // a contributor that is the caller's seed gradient

  struct Buffer {
    BufferKind kind = BufferKind::kGrad;
    int owner = -1;   // kGrad/kStaged: the step that consumes it; kLeaf: -1
    int target = -1;  // kStaged: the kGrad buffer it is added into
    Tensor leaf;      // kLeaf: the leaf
    Shape shape;
    int stream = 0;  // where it is accumulated: the owner's stream (kLeaf: each contributor's)
    std::vector<int> contributors;  // steps in plan order; kSeed for a seed
    int first_use = -1;  // first step that writes or reads it (kSeed contributions count as -1)
    int last_use = -1;   // last step that reads (kGrad/kStaged) or writes (kLeaf) it
  };
  // Where one input's gradient goes: nowhere (buffer -1), or into a buffer, written (=) or added
  // (+=).
  struct Write {
    int buffer = -1;
    bool accumulate = false;
  };
  struct Step {
    Node* node = nullptr;       // not owned here: `owners` keeps it alive
    int stream = 0;             // index into streams
    int grad_buffer = -1;       // the kGrad buffer this step consumes
    std::vector<Write> writes;  // one per node input
    std::vector<int> staged;  // kStaged buffers (and kSeed via seeds) added into grad_buffer first
    std::vector<int> seeds;   // root indices whose seed is added into grad_buffer first
    std::vector<int> waits;   // indices into waits: this step's stream waits on them first
    int event = -1;           // event recorded on this step's stream after it, or -1
    // Weight-gradient parallelism (PlanOptions::split_weight_grads): the node's leaf gradients
    // are computed on `side_stream` (an index into streams whose handle is nullptr: the executor
    // supplies the stream), which first waits on `side_fork_event` (recorded on this step's
    // stream once its gradient is assembled) and on `side_waits`, and records `side_event` after.
    // -1 when the step is not split.
    int side_stream = -1;
    int side_fork_event = -1;
    std::vector<int> side_waits;
    int side_event = -1;
    // Note [Backward epilogue fusion] (engine/ops/ops.h): this step's input-0 gradient is the
    // pre-activation gradient of step `fuses_activation_of` (its sole consumer's); -1: not fused.
    int fuses_activation_of = -1;
    // This step's grad_buffer holds the gradient of its pre-activation (its consumer applied the
    // activation's backward).
    bool preactivation_grad = false;
  };
  struct Wait {
    int producer;                // step
    int consumer;                // step
    int event;                   // recorded after the producer, waited on by the consumer's stream
    bool producer_side = false;  // the producer is the step's side part (its leaf gradients)
    bool consumer_side = false;  // the consumer is the step's side part
  };
  struct LeafSeed {  // a root that is itself a leaf: its seed is written into .grad first
    int root;
    int buffer;
    bool accumulate;
  };

  std::vector<cudaStream_t> streams;  // streams[0] is the caller's stream; nullptr: a side stream
  // Per stream index: the forward stream index a side stream serves, or -1 for a forward stream.
  std::vector<int> side_of;
  std::vector<Step> steps;
  std::vector<Wait> waits;
  std::vector<int> forks;  // stream indices that first wait on the caller's stream
  std::vector<int> joins;  // stream indices the caller's stream waits on at the end
  std::vector<Buffer> buffers;
  std::vector<LeafSeed> leaf_seeds;
  std::vector<int> root_steps;  // per root: the step of its node, or -1 for a leaf root
  // Note [Streams of an eager backward]: set by run_on_caller_stream — the forward streams whose
  // steps it moved onto the caller's stream, and those of them that made a root (the caller's
  // stream waits for them before the first step). Empty in a plan as planned.
  std::vector<cudaStream_t> moved_streams;
  std::vector<cudaStream_t> caller_waits;
  int num_events = 0;
  GradWrite grad_write = GradWrite::kAccumulate;
  // The roots' nodes, owned: through their edges they keep every node of the plan alive, so a
  // plan kept after its loss is gone still points at live nodes (dump(), a run).
  std::vector<std::shared_ptr<Node>> owners;

  // A readable dump: streams, forks, joins, every step with its waits and writes, every buffer;
  // then the program a run issues, instruction by instruction (backward_program.h).
  std::string dump() const;
  int num_cross_stream_waits() const { return static_cast<int>(waits.size()); }
};

struct PlanOptions {
  // Move the leaf (weight and bias) gradients of every node that also has a node-edge input onto
  // a side stream per forward stream, off the critical path (the input gradient). Opt-in.
  bool split_weight_grads = false;
  // Note [Backward epilogue fusion] (engine/ops/ops.h): a linear+activation layer's activation
  // backward rides in its consumer's input-gradient GEMM where the plan allows.
  bool fuse_activation_epilogues = true;
};

// Note [Streams of an eager backward]
// Streams let the GPU run two branches' kernels at once. An eager backward pays for them on the
// host: a fork, a join and an event for every gradient that crosses streams, a few CUDA calls a
// stream, while the host issues the whole backward one kernel after another on one thread either
// way. Where the GPU finishes each kernel before the host has issued the next, nothing can overlap
// and the streams are all cost (the review's sweep at small N: docs/DECISIONS.md, "a short eager
// backward runs on the caller's stream alone"). So an eager backward (EagerStreams::kAuto,
// engine/backward/backward.h) estimates its device work from the tape — each node's backward_flops() at
// the device's float32 rate, plus the bytes of its inputs, output and saved tensors at the memory's
// bandwidth (device_throughput, engine/runtime/device.h: both rates low, so the estimate errs long) — and
// where the whole of it is under kHostFloorUs a step (the least host time a step costs), runs every
// step on the caller's stream (run_on_caller_stream). Only the streams change: the plan's buffers,
// and so the order in which contributions are added, stay the multistream plan's, so the gradients
// are bitwise those of the multistream backward and of its replay. The caller's stream first waits
// for the stream of each root made on another stream; every other node is ordered before its root's
// production by the waits of the forward (rule [read after write]). Memory of the moved streams
// that the caller's stream read goes back to their caches after the backward, one wait a stream
// (Note [Frees at the join], engine/runtime/memory.h). A captured backward keeps its streams (a replay's
// host cost does not grow with them, and the GPU runs short kernels of two branches at once), and
// so does a backward issued inside a capture; a plan with side streams (split_weight_grads, asked
// for) and EagerStreams::kForward keep them too: rule [forward stream] holds there. The estimate
// and the move are in engine/backward/eager_streams.cpp.
inline constexpr double kHostFloorUs = 4.0;
// The estimated device time of the plan's steps, in microseconds; negative when `throughput` is
// unknown (a zero rate).
double estimate_device_us(const BackwardPlan& plan, DeviceThroughput throughput);
// Whether run_on_caller_stream applies: more than one stream, no side stream, and an estimate
// under kHostFloorUs a step.
bool host_bound(const BackwardPlan& plan, DeviceThroughput throughput);
// Moves every step onto the caller's stream: drops the forks, joins and waits and the other
// streams, and fills moved_streams and caller_waits.
void run_on_caller_stream(BackwardPlan& plan);

// Note [Gradient buckets]
// For data parallelism (a GradientReducer, engine/backward/backward.h) the leaf gradients a plan writes
// are reduced across processes in buckets, while the rest of the backward runs. A leaf's gradient
// is final after the last step that writes it (its buffer's last_use), on that step's stream — or
// on its side stream when the step is split (split_weight_grads puts leaf gradients there); a leaf
// written only by a seed is final before the first step. Buckets take the leaves in the order
// their gradients become final — estimated by running the plan with one unit of time a step, so
// that across streams the leaves of parallel branches that are ready together go together (plan
// order would put a whole branch, its first layer's gradient too, before the next branch's last
// layer) — and close once they hold `bucket_bytes` — the first once it holds
// `first_bucket_bytes` (0: bucket_bytes), so that the first reduction starts early and runs under
// the rest of the backward, as PyTorch's DistributedDataParallel does (the last may hold less) —
// but never between two leaves estimated to be ready together (a layer's weight and bias,
// parallel branches' same layer: splitting them would not let the first part start any earlier,
// only add a reduction: with 4 MiB buckets, the 4-branch study's last layer's last bias, 1 KiB,
// was reduced alone at the end, a third NCCL kernel);
// a bucket is issued right after the step that finishes its last gradient in plan order (and no
// earlier than the bucket before it), once the reduction stream has waited for the latest such
// step on every stream involved (the earlier ones on the same stream are ordered before it).
struct GradBucket {
  struct Ready {
    int step;   // -1: the seeds, on the caller's stream, before the first step
    bool side;  // the step's side part (its leaf gradients)
  };
  std::vector<int> buffers;  // kLeaf buffers, in the (estimated) order they become final
  std::size_t bytes = 0;
  int issue_after = -1;      // the step after which the bucket is issued (-1: before the first)
  std::vector<Ready> ready;  // per stream, the latest step whose writes the bucket waits for
};
std::vector<GradBucket> plan_grad_buckets(const BackwardPlan& plan, std::size_t bucket_bytes,
                                          std::size_t first_bucket_bytes = 0);

// Plans the backward of `roots` called on `caller_stream` (nullptr on the CPU). Checks, before
// anything runs, that every node is on one device and still holds its saved tensors.
BackwardPlan plan_backward(const std::vector<PlanRoot>& roots, cudaStream_t caller_stream,
                           GradWrite grad_write = GradWrite::kAccumulate, PlanOptions options = {});

}  // namespace graphward
