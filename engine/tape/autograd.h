#pragma once
// The autograd tape.
//
// A recorded forward op produces a Node: the op's name, the stream and device it ran on
// (docs/DESIGN.md rule [current stream]), metadata of each input (shape, dtype, device, the stream
// that produced it) with the edge its gradient flows along, the tensors its backward needs (with
// their versions), and a backward closure. A node's single output keeps the node alive as its
// grad_fn; nodes keep their inputs' nodes alive through edges; a graph lives as long as some output
// of it does.
//
// Edges: an input that requires grad either came from a node (edge to that node) or is a leaf
// (edge to the leaf tensor, whose .grad receives the gradient); an input that does not require grad
// has an empty edge.
//
// Recording happens when grad mode is on (the default; NoGradGuard turns it off for a scope) and
// some input requires grad.
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/runtime/tensor.h"
#include "graphward/engine/tape/grad_slot.h"

namespace graphward {

struct Edge {
  std::shared_ptr<Node> node;  // the input's grad_fn, or
  Tensor leaf;                 // the input itself, a leaf that requires grad
  bool valid() const { return node != nullptr || leaf.defined(); }
};

struct InputMeta {
  Shape shape;
  DType dtype;
  Device device;
  cudaStream_t stream;  // the stream that produced the input (nullptr on the CPU)
  Edge edge;
};

// A tensor a backward needs, with the version it had when saved (Note [Saved tensor versions]).
struct SavedTensor {
  std::string name;
  Tensor tensor;  // detached: a saved output must not keep its own grad_fn alive
  std::uint64_t version = 0;
};

// Note [Node record]
// A node's structure as plain words, made once when the node is created (its data is at hand
// then): the op (its interned name), the node's stream, its output shape, and per input the edge
// kind (0 none, 1 node, 2 leaf), the edge's target, the dtype, the producing stream and — unless
// the edge is a node's, whose record has it — the shape; per saved tensor whether it is defined,
// its dtype and shape. Tags open the record. Fields that name per-step objects (a producing node,
// a stream, a leaf) hold raw identifiers and are listed in `patches`, so that a walk of the tape
// can number them canonically (capture/signature.cpp, which also decodes records). Saved tensors'
// data pointers are kept in `saved_addresses`. The arrays are views of one allocation the node
// owns (with its saved tensors' storages): a node is recorded for every op of every step, and one
// allocation a node costs the host less than one an array.
struct NodeRecord {
  enum class Patch : std::uint8_t { kStream, kNode, kLeaf };
  struct PatchAt {
    std::uint32_t word;  // position in `words`
    Patch kind;
    std::uint32_t input;  // kLeaf: the input whose edge is the leaf
  };
  static constexpr std::uint64_t kTag = 0x4e4f4445;  // "NODE"
  std::span<const std::uint64_t> words;
  std::span<const PatchAt> patches;
  std::span<const std::pair<std::uintptr_t, std::uint32_t>> saved_addresses;  // (data, saved index)
  std::span<const Node* const> producers;  // the input nodes, in input order (nullptr: none)
};

// Note [Node attributes]
// What an op's backward uses besides tensors and shapes — a scale factor, a window's start, the
// dimensions a transpose swaps, a convolution's stride and padding — is baked into a captured
// graph's kernels with the values of the step it was captured from. So the op records them with
// its node, at the end of the node's record (Note [Node record]), and a tape signature compares
// them as it compares shapes: a step whose attributes changed is another structure, captured
// anew, never a replay of a graph made with the old values. Each attribute is a tagged word: an
// integer or a double's bits (compared bit for bit; printed by TapeSignature::describe_node).
struct NodeAttribute {
  std::uint64_t bits = 0;
  bool real = false;  // `bits` are a double's
  static NodeAttribute integer(std::int64_t v) { return {static_cast<std::uint64_t>(v), false}; }
  static NodeAttribute number(double v) { return {std::bit_cast<std::uint64_t>(v), true}; }
};

class Node {
 public:
  // Computes the gradients of the inputs from grad_out, writing them into `grads` (one slot per
  // input; null slots are not wanted). `saved` are the saved tensors, version-checked.
  using BackwardFn = std::function<void(const Tensor& grad_out, const std::vector<Tensor>& saved,
                                        std::span<GradSlot> grads)>;

  Node(std::string name, Device device, cudaStream_t stream, std::vector<InputMeta> inputs,
       std::vector<SavedTensor> saved, Shape output_shape, BackwardFn backward,
       std::span<const NodeAttribute> attributes = {});
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  // The name, interned: one pointer per distinct name for the life of the process (cheap to
  // compare and safe to keep after the node is gone, as tape signatures do).
  const std::string* interned_name() const { return interned_name_; }
  Device device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const std::vector<InputMeta>& inputs() const { return inputs_; }
  const Shape& output_shape() const { return output_shape_; }
  // The tensors the backward reads (empty once released).
  const std::vector<SavedTensor>& saved() const { return saved_; }
  // Note [Node record]. Describes the node as created (not affected by release_saved()).
  const NodeRecord& record() const { return record_; }
  // Order of creation in this process: a later node never feeds an earlier one.
  std::uint64_t sequence_nr() const { return sequence_nr_; }
  // Released by a backward: on its own (release_saved) or with its whole step by a replay (Note
  // [Reads of a replayed step]; its saved tensors are then dropped on the release worker's thread,
  // so saved() may still list them for a while).
  bool released() const {
    return released_.load(std::memory_order_acquire) ||
           (step_reads_ && step_reads_->replayed.load(std::memory_order_acquire));
  }
  // "linear#17"
  std::string label() const { return name_ + "#" + std::to_string(sequence_nr_); }
  // Why a backward through this node is refused: "backward through linear#17 a second time: ...",
  // naming a backward that failed part-way after freeing it (Note [A failed backward]).
  std::string released_message() const;
  // Note [A failed backward]: this node's saved tensors were freed by a backward that then failed.
  void note_released_by_failed_backward() {
    released_by_failure_.store(true, std::memory_order_release);
  }
  // Note [Backwards sharing a tape]: a backward's claim on this node while it runs through it,
  // alone (`exclusive`: it frees the saved tensors) or shared with other backwards that keep them.
  // try_claim fails, taking nothing, where the node is claimed otherwise; NodeClaims holds them.
  bool try_claim(bool exclusive) const noexcept;
  void release_claim(bool exclusive) const noexcept;
  // The bytes of the saved tensors as recorded (not affected by release_saved()): what a cost
  // estimate may read while another thread's backward frees them.
  std::size_t saved_bytes() const { return saved_bytes_; }

  // Runs the backward. Throws if the saved tensors were released (second backward without
  // retain_graph) or one of them was modified in place since it was saved.
  void apply(const Tensor& grad_out, std::span<GradSlot> grads) const;
  // The checks of apply() alone, so that a backward can refuse before it launches anything.
  void check_saved() const;
  // check_saved() without building anything unless it fails (for walks that run every step).
  void check_saved_fast() const {
    if (released()) check_saved();
    for (std::size_t i = 0; i < saved_storages_.size(); ++i) {
      if (saved_storages_[i] && saved_storages_[i]->version() != saved_[i].version) check_saved();
    }
  }
  // Frees the saved tensors (a backward without retain_graph). With `hand_off`, the saved tensors
  // are moved there (appended) instead of destroyed here, for a ReleaseWorker to drop on its
  // thread (Note [Deferred release], engine/tape/deferred_release.h): everything else — the node
  // marked released, its storages' saved counts — is done here. `count_mutation`: a release of a
  // logged node counts as a tape mutation (Note [Tape log]); a caller that counts the step's once
  // passes false.
  void release_saved(std::vector<SavedTensor>* hand_off = nullptr, bool count_mutation = true);
  // Note [Reads of a replayed step]: drops the saved tensors of a node that a replay released with
  // its step (the release worker calls it; the storages' counts are given back as they settle).
  void drop_saved_of_replayed_step();
  // The step this node was recorded in, if the tape log was on (Note [Reads of a replayed step]).
  const std::shared_ptr<detail::StepReads>& step_reads() const { return step_reads_; }
  // Makes saved tensor `j` read `copy` instead: a tensor of the same shape and dtype that holds
  // the same values (Note [Input slots], capture/backward_graph.h: a captured backward reads a
  // slot it refreshes every step in place of the step's batch). Its version becomes the one
  // checked.
  void substitute_saved(std::size_t j, const Tensor& copy);
  // Whether saved tensor `j` is one of the op's inputs that entered the tape from outside: no
  // gradient flows to it and no recorded op produced its memory (a batch, targets, ids, a mask,
  // a frozen weight). Set by the op's recording (bit j of `mask`, j < 64).
  bool saved_from_outside(std::size_t j) const { return j < 64 && (from_outside_ >> j) & 1u; }
  void set_saved_from_outside(std::uint64_t mask) { from_outside_ = mask; }

  // Note [Backward epilogue fusion] (engine/ops/ops.h): set by linear() and conv2d() on the nodes they
  // record.
  struct ActivationFusion {
    Activation act = Activation::kNone;
    int act_input_saved = -1;       // saved index: the output (ReLU) or the pre-activation (GELU)
    int relu_mask_saved = -1;       // saved index of ReLU's bit mask, or -1 (none was written)
    BackwardFn from_preactivation;  // the backward given the pre-activation's gradient
  };
  // Set on a linear+activation layer (and a conv2d_relu), which may leave its activation
  // backward to the layer that consumes its output; null otherwise.
  const ActivationFusion* activation_fusion() const { return fusion_.get(); }
  void set_activation_fusion(ActivationFusion fusion);
  // Set on a linear layer and a pooling, whose backward takes GradSlot::epilogue on input 0.
  bool takes_input_epilogue() const { return input_epilogue_; }
  void set_takes_input_epilogue() { input_epilogue_ = true; }
  // apply() for a fused layer: grad_out is the pre-activation's gradient.
  void apply_from_preactivation(const Tensor& grad_out, std::span<GradSlot> grads) const;
  // Note [Gradient buckets] (engine/backward/backward_plan.cpp): set on a node whose backward hands
  // grad_out itself to its inputs where their slots may share it, launching nothing (add of two
  // operands of the output's shape); the buckets' estimate of when gradients are final counts its
  // step as taking no time.
  bool passes_gradient_through() const { return passes_gradient_through_; }
  void set_passes_gradient_through() { passes_gradient_through_ = true; }
  // Note [Streams of an eager backward] (engine/backward/backward_plan.h): the floating-point operations
  // of the node's backward, set by the ops whose backward is a matrix product (linear, matmul,
  // bmm, conv2d: both operands' gradients counted, needed or not); 0 for the others, whose cost
  // is estimated from the bytes they touch.
  double backward_flops() const { return backward_flops_; }
  void set_backward_flops(double flops) { backward_flops_ = flops; }

 private:
  std::vector<Tensor> saved_tensors() const;
  std::string name_;
  const std::string* interned_name_;
  Device device_;
  cudaStream_t stream_;
  std::vector<InputMeta> inputs_;
  std::vector<SavedTensor> saved_;
  Shape output_shape_;
  BackwardFn backward_;
  std::uint64_t sequence_nr_;
  std::atomic<bool> released_{false};
  std::atomic<bool> released_by_failure_{false};
  static constexpr std::uint32_t kExclusiveClaim = 0x80000000u;
  mutable std::atomic<std::uint32_t> claims_{0};  // kExclusiveClaim, or the shared claims' count
  std::size_t saved_bytes_ = 0;
  // Note [Node record]: the record's arrays and saved_storages_, in one allocation.
  std::unique_ptr<std::byte[]> record_memory_;
  NodeRecord record_;
  std::span<const Storage*>
      saved_storages_;  // per saved tensor (nullptr: undefined); empty once released
  std::shared_ptr<detail::StepReads> step_reads_;  // step_reads()
  std::unique_ptr<ActivationFusion> fusion_;
  bool input_epilogue_ = false;
  bool passes_gradient_through_ = false;
  double backward_flops_ = 0;
  std::uint64_t from_outside_ = 0;  // saved_from_outside()

 public:
  // Scratch for walks of the tape (capture/signature.cpp): a walk takes a fresh epoch and marks
  // each node it reaches with it and its index, instead of hashing node pointers. One walk of a
  // tape at a time.
  mutable std::uint64_t walk_epoch = 0;
  mutable int walk_index = -1;
  // The tape log (Note [Tape log]) this node was appended to, and its number there (0, -1: none).
  std::uint64_t log_epoch = 0;
  int log_index = -1;
};

// Note [Backwards sharing a tape]: the claims of one backward on the nodes it runs, given back
// when it is destroyed. add() claims one more node, or throws a graphward::Error naming it (and
// what holds it) and gives back every claim taken so far; it also refuses a node already released.
class NodeClaims {
 public:
  explicit NodeClaims(bool exclusive) : exclusive_(exclusive) {}
  ~NodeClaims() { release_all(); }
  NodeClaims(const NodeClaims&) = delete;
  NodeClaims& operator=(const NodeClaims&) = delete;
  void add(const Node& node);
  // Claims every node of `step` at once (exclusive claims only): false, holding nothing of it,
  // where a node of the step is claimed by another backward (then claim them one by one).
  bool claim_step(detail::StepReads& step);
  void release_all() noexcept;
  bool exclusive() const { return exclusive_; }
  // While a ThreadScope lives, the backwards this thread runs take no claims of their own: the
  // scope's owner (a replay that captures on its way) holds them already.
  class ThreadScope {
   public:
    ThreadScope();
    ~ThreadScope();
    ThreadScope(const ThreadScope&) = delete;
    ThreadScope& operator=(const ThreadScope&) = delete;

   private:
    bool previous_;
  };
  static bool held_by_this_thread();

 private:
  bool exclusive_;
  std::vector<const Node*> held_;
  detail::StepReads* step_ = nullptr;
};

namespace debug {
// Nodes alive in the process (recorded and hand-built): for tests that a tape is freed whole.
std::size_t live_nodes();
}  // namespace debug

// ---- grad mode ----------------------------------------------------------------------------------
bool grad_mode_enabled();
// Turns recording off for the scope (per thread), e.g. for optimizer updates.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// For hand-built tapes (plan tests) and ops: a node over `inputs` with nothing saved.
std::shared_ptr<Node> make_node(std::string name, Device device, cudaStream_t stream,
                                std::vector<InputMeta> inputs, Shape output_shape,
                                Node::BackwardFn backward = {});

namespace autograd_detail {
// Whether an op over `inputs` must be recorded.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(std::span<const Tensor* const> inputs);
// Records `output` as produced by a node named `op` over `inputs`, saving `saved`. The node's
// stream is the stream that produced `output`. `attributes`: what the backward uses besides
// tensors and shapes (Note [Node attributes]).
void record(const char* op, const Tensor& output, std::initializer_list<const Tensor*> inputs,
            std::vector<SavedTensor> saved, Node::BackwardFn backward,
            std::initializer_list<NodeAttribute> attributes = {});
void record(const char* op, const Tensor& output, std::span<const Tensor* const> inputs,
            std::vector<SavedTensor> saved, Node::BackwardFn backward,
            std::initializer_list<NodeAttribute> attributes = {});
SavedTensor save(const char* name, const Tensor& t);
}  // namespace autograd_detail

}  // namespace graphward
