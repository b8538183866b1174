#include "graphward/engine/tape/autograd.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <unordered_set>

#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/tape/host_state.h"
#include "graphward/engine/tape/tape_log.h"

namespace graphward {

namespace {
std::atomic<std::uint64_t> g_next_sequence_nr{0};
std::atomic<std::size_t> g_live_nodes{0};
thread_local bool t_grad_mode = true;

// Op names, interned for the life of the process (never freed: a handful of short strings).
const std::string* intern_shared(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  return &*names->insert(name).first;
}

// A node is recorded for every op of every step: in front of the shared set (a lock and a hash
// of the name), a direct-mapped cache of this thread's names, keyed by a short hash of the
// name's first bytes and its length, compared in full before it is trusted.
const std::string* intern(const std::string& name) {
  struct Entry {
    const std::string* interned = nullptr;
  };
  thread_local Entry cache[64];
  std::size_t h = name.size() * 0x9e3779b97f4a7c15u;
  const std::size_t n = std::min<std::size_t>(name.size(), 24);
  for (std::size_t i = 0; i < n; ++i)
    h = (h ^ static_cast<unsigned char>(name[i])) * 0x100000001b3u;
  Entry& e = cache[(h >> 29) & 63];
  if (e.interned && *e.interned == name) return e.interned;
  e.interned = intern_shared(name);
  return e.interned;
}
}  // namespace

Node::Node(std::string name, Device device, cudaStream_t stream, std::vector<InputMeta> inputs,
           std::vector<SavedTensor> saved, Shape output_shape, BackwardFn backward,
           std::span<const NodeAttribute> attributes)
    : name_(std::move(name)),
      interned_name_(intern(name_)),
      device_(device),
      stream_(stream),
      inputs_(std::move(inputs)),
      saved_(std::move(saved)),
      output_shape_(std::move(output_shape)),
      backward_(std::move(backward)),
      sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {
  g_live_nodes.fetch_add(1, std::memory_order_relaxed);
  // Note [Node record]: bounds first (each array's size at most), then one allocation for all.
  std::size_t n = 7 + output_shape_.size() + 2 * attributes.size();
  for (const InputMeta& in : inputs_) n += 5 + (in.edge.node ? 0 : in.shape.size());
  std::size_t defined_saved = 0;
  for (const SavedTensor& st : saved_) {
    n += 3 + (st.tensor.defined() ? st.tensor.shape().size() : 0);
    defined_saved += st.tensor.defined() ? 1 : 0;
    saved_bytes_ += st.tensor.defined() ? st.tensor.nbytes() : 0;
  }
  const std::size_t max_patches =
      1 + 2 * inputs_.size();  // the node's stream; per input its edge, stream
  using Address = std::pair<std::uintptr_t, std::uint32_t>;
  auto round8 = [](std::size_t bytes) { return (bytes + 7) / 8 * 8; };
  const std::size_t at_producers = n * sizeof(std::uint64_t);
  const std::size_t at_storages = at_producers + inputs_.size() * sizeof(const Node*);
  const std::size_t at_addresses = at_storages + saved_.size() * sizeof(const Storage*);
  const std::size_t at_patches = at_addresses + defined_saved * sizeof(Address);
  const std::size_t bytes = round8(at_patches + max_patches * sizeof(NodeRecord::PatchAt));
  record_memory_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
  std::byte* const mem = record_memory_.get();
  auto* const w = reinterpret_cast<std::uint64_t*>(mem);  // trivial types: written, then read
  std::size_t nw = 0;
  auto* const patches = reinterpret_cast<NodeRecord::PatchAt*>(mem + at_patches);
  std::size_t np = 0;
  auto* const producers = reinterpret_cast<const Node**>(mem + at_producers);
  auto* const storages = reinterpret_cast<const Storage**>(mem + at_storages);
  auto* const addresses = reinterpret_cast<Address*>(mem + at_addresses);
  std::size_t na = 0;
  auto word = [w, &nw](std::uint64_t v) { w[nw++] = v; };
  auto shape = [&word](const Shape& sh) {
    word(sh.size());
    for (std::int64_t d : sh) word(static_cast<std::uint64_t>(d));
  };
  using Patch = NodeRecord::Patch;
  auto patch = [patches, &np, &nw](Patch kind, std::uint32_t input = 0) {
    new (patches + np++) NodeRecord::PatchAt{static_cast<std::uint32_t>(nw), kind, input};
  };
  word(NodeRecord::kTag);
  word(reinterpret_cast<std::uintptr_t>(interned_name_));
  patch(Patch::kStream);
  word(reinterpret_cast<std::uintptr_t>(stream_));
  shape(output_shape_);
  word(inputs_.size());
  word(saved_.size());
  for (std::size_t i = 0; i < inputs_.size(); ++i) producers[i] = inputs_[i].edge.node.get();
  for (std::size_t j = 0; j < saved_.size(); ++j) {
    storages[j] = saved_[j].tensor.defined() ? saved_[j].tensor.storage().get() : nullptr;
  }
  for (std::uint32_t i = 0; i < inputs_.size(); ++i) {
    const InputMeta& in = inputs_[i];
    if (in.edge.node) {
      word(1);
      patch(Patch::kNode);
      word(reinterpret_cast<std::uintptr_t>(in.edge.node.get()));
    } else if (in.edge.leaf.defined()) {
      word(2);
      patch(Patch::kLeaf, i);
      word(0);
    } else {
      word(0);
      word(0);
    }
    word(static_cast<std::uint64_t>(in.dtype));
    patch(Patch::kStream);
    word(reinterpret_cast<std::uintptr_t>(in.stream));
    if (!in.edge.node) shape(in.shape);
  }
  for (std::uint32_t j = 0; j < saved_.size(); ++j) {
    const Tensor& t = saved_[j].tensor;
    word(t.defined());
    if (!t.defined()) continue;
    word(static_cast<std::uint64_t>(t.dtype()));
    shape(t.shape());
    new (addresses + na++) Address(reinterpret_cast<std::uintptr_t>(t.raw_data()), j);
  }
  word(attributes.size());  // Note [Node attributes]
  for (const NodeAttribute& a : attributes) {
    word(a.real);
    word(a.bits);
  }
  record_.words = {w, nw};
  record_.patches = {patches, np};
  record_.saved_addresses = {addresses, na};
  record_.producers = {producers, inputs_.size()};
  saved_storages_ = {storages, saved_.size()};
  for (const Storage* st : saved_storages_) {
    if (st) st->note_saved(+1);
  }
  detail::tape_log_append(*this);  // Note [Tape log]
  if (log_epoch != 0) {            // Note [Reads of a replayed step]
    step_reads_ = detail::tape_log().reads;
    if (step_reads_) {
      for (const Storage* st : saved_storages_) {
        if (st) st->note_step_save(step_reads_);
      }
    }
  }
}

// Note [Releasing a long tape]
// A node owns the nodes of its inputs (edges), so the last handle on a chain's loss would free the
// chain recursively, one stack frame a node: a tape of a few hundred thousand nodes (an unrolled
// RNN) would overflow the stack after its backward succeeded. Instead a dying node takes the input
// nodes it is the last owner of into a list of its own and frees them one at a time, each first
// giving up its own inputs to the list: the depth stays at two frames whatever the tape's length
// (as PyTorch's deleteNode does). Only sole owners are taken: a node another handle still holds
// stays where it is.
Node::~Node() {
  // A node destroyed before its step was released: the step can no longer be released as a whole.
  if (step_reads_ && !saved_storages_.empty()) step_reads_->partial = true;
  for (const Storage* st : saved_storages_) {
    if (st) st->note_saved(-1);
  }
  g_live_nodes.fetch_sub(1, std::memory_order_relaxed);
  std::vector<std::shared_ptr<Node>> dying;
  auto take_sole_inputs = [&dying](std::vector<InputMeta>& inputs) {
    for (InputMeta& in : inputs) {
      if (in.edge.node && in.edge.node.use_count() == 1) dying.push_back(std::move(in.edge.node));
    }
  };
  take_sole_inputs(inputs_);
  while (!dying.empty()) {
    std::shared_ptr<Node> n = std::move(dying.back());
    dying.pop_back();
    take_sole_inputs(n->inputs_);
  }  // n is freed here, with no input left that it alone owns
}

// Note [Saved tensor versions]
// A backward reads the tensors its forward saved. If one was modified in place after it was saved
// (its storage's version moved on), the gradient would be silently wrong; instead the backward
// fails and names the op, the tensor and both versions, as PyTorch does.
std::string Node::released_message() const {
  if (released_by_failure_.load(std::memory_order_acquire)) {
    return detail::concat("backward through ", label(),
                          " a second time: its saved tensors were "
                          "freed by a backward that then failed part-way (its error said where); "
                          "run the forward again, then the backward");
  }
  return detail::concat("backward through ", label(),
                        " a second time: its saved tensors were freed "
                        "by the previous backward; pass retain_graph = true to the first backward "
                        "to keep them");
}

void Node::check_saved() const {
  GW_CHECK(!released(), released_message());
  for (const SavedTensor& s : saved_) {
    GW_CHECK(s.tensor.version() == s.version, "one of the tensors needed for the gradient of ",
             label(), " was modified in place: '", s.name, "' (", s.tensor.str(),
             ") is at version ", s.tensor.version(), "; expected version ", s.version,
             " (the version when the forward saved it)");
  }
}

void Node::apply(const Tensor& grad_out, std::span<GradSlot> grads) const {
  check_saved();
  GW_CHECK(backward_, "node ", label(), " has no backward function");
  backward_(grad_out, saved_tensors(), grads);
}

std::vector<Tensor> Node::saved_tensors() const {
  std::vector<Tensor> saved;
  saved.reserve(saved_.size());
  for (const SavedTensor& s : saved_) saved.push_back(s.tensor);
  return saved;
}

void Node::set_activation_fusion(ActivationFusion fusion) {
  GW_CHECK(fusion.act != Activation::kNone && fusion.from_preactivation &&
               fusion.act_input_saved >= 0 &&
               fusion.act_input_saved < static_cast<int>(saved_.size()) &&
               fusion.relu_mask_saved < static_cast<int>(saved_.size()),
           "node ", label(),
           ": an activation fusion needs an activation, its saved input and a "
           "backward from the pre-activation");
  fusion_ = std::make_unique<ActivationFusion>(std::move(fusion));
}

void Node::apply_from_preactivation(const Tensor& grad_out, std::span<GradSlot> grads) const {
  check_saved();
  GW_CHECK(fusion_, "node ", label(), " has no activation fusion (an internal error of the plan)");
  fusion_->from_preactivation(grad_out, saved_tensors(), grads);
}

void Node::drop_saved_of_replayed_step() {
  saved_storages_ = {};
  saved_.clear();
}

void Node::release_saved(std::vector<SavedTensor>* hand_off, bool count_mutation) {
  if (step_reads_) step_reads_->partial = true;  // released on its own
  // A logged tape changed under the log (Note [Tape log]); a backward's own release is followed by
  // a reset of the log.
  if (count_mutation && log_epoch != 0 && !released_.load(std::memory_order_relaxed)) {
    detail::tape_mutations().fetch_add(1, std::memory_order_acq_rel);
  }
  for (const Storage* st : saved_storages_) {
    if (st) st->note_saved(-1);
  }
  saved_storages_ = {};
  if (hand_off) {
    for (SavedTensor& s : saved_) hand_off->push_back(std::move(s));
    saved_.clear();
  } else {
    saved_.clear();
    saved_.shrink_to_fit();
  }
  released_.store(true, std::memory_order_release);
}

// Note [Backwards sharing a tape]
// Two threads may backpropagate through one graph: a prefix shared by two losses (the same
// activations feeding two heads), or a tape handed to another thread. A backward without
// retain_graph frees each node's saved tensors right after its step, so a second backward running
// through the same nodes at the same time would read what the first frees. So a backward claims
// every node of its plan before it reads any of them (its checks of the saved tensors come after
// the claims): a backward that frees them (no retain_graph; a replay, which releases its step)
// claims each node alone, one that keeps them (retain_graph; a capture) shares its claims with
// others that keep them. A claim that cannot be had is refused at once, before anything is
// written, by an error naming the node — never waited for: a backward that waits on another while
// holding claims of its own could wait forever (Note [Leaves shared across threads] makes
// backwards wait on each other's leaves). So of two backwards through one graph that overlap in
// time, at least one of which frees it, the one that claims second fails with nothing written,
// as the second would fail run after the first ("a second time"); two that keep the graph run
// side by side. Which thread wins is the threads' race; that no backward reads freed memory is
// not. Uncontended, a claim costs one atomic exchange and one store a node.
//
// A replay that reaches every node of a step recorded by the tape log (Note [Reads of a replayed
// step], engine/runtime/memory.h) claims the step's StepReads instead, alone: one atomic where a claim a
// node would touch every node of the step on the replay's host path (7% of a 196-node replay's host
// time, measured). A claim of a node of that step first counts itself on the step, then checks the
// step's claim; the step's claimer sets its claim, then checks the count: with both orders
// sequentially consistent, of two that overlap at least one sees the other and gives way.
bool Node::try_claim(bool exclusive) const noexcept {
  detail::StepReads* const step = step_reads_.get();
  if (step) {
    step->node_claims.fetch_add(1, std::memory_order_seq_cst);
    if (step->claimed.load(std::memory_order_seq_cst)) {
      step->node_claims.fetch_sub(1, std::memory_order_release);
      return false;
    }
  }
  std::uint32_t cur = claims_.load(std::memory_order_relaxed);
  bool ok = false;
  if (exclusive) {
    ok = cur == 0 &&
         claims_.compare_exchange_strong(cur, kExclusiveClaim, std::memory_order_acq_rel);
  } else {
    while ((cur & kExclusiveClaim) == 0) {
      if (claims_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) {
        ok = true;
        break;
      }
    }
  }
  if (!ok && step) step->node_claims.fetch_sub(1, std::memory_order_release);
  return ok;
}

void Node::release_claim(bool exclusive) const noexcept {
  if (exclusive) {
    claims_.store(0, std::memory_order_release);
  } else {
    claims_.fetch_sub(1, std::memory_order_release);
  }
  if (step_reads_) step_reads_->node_claims.fetch_sub(1, std::memory_order_release);
}

bool NodeClaims::claim_step(detail::StepReads& step) {
  bool expected = false;
  if (!step.claimed.compare_exchange_strong(expected, true, std::memory_order_seq_cst)) {
    return false;
  }
  if (step.node_claims.load(std::memory_order_seq_cst) != 0) {
    step.claimed.store(false, std::memory_order_release);
    return false;
  }
  step_ = &step;
  return true;
}

void NodeClaims::add(const Node& node) {
  if (!node.try_claim(exclusive_)) {
    release_all();
    GW_CHECK(false, "backward through ", node.label(),
             " while another backward runs through it (on another thread): ",
             exclusive_ ? "this backward" : "that backward",
             " frees the graph's saved tensors (no retain_graph), so the two cannot overlap; run "
             "them one after the other, or pass retain_graph = true to both. Nothing was written");
  }
  held_.push_back(&node);
  if (node.released()) {
    const std::string message = node.released_message();
    release_all();
    GW_CHECK(false, message);
  }
}

namespace {
thread_local bool t_claims_held = false;
}  // namespace

NodeClaims::ThreadScope::ThreadScope() : previous_(t_claims_held) {
  t_claims_held = true;
}
NodeClaims::ThreadScope::~ThreadScope() {
  t_claims_held = previous_;
}
bool NodeClaims::held_by_this_thread() {
  return t_claims_held;
}

void NodeClaims::release_all() noexcept {
  for (const Node* n : held_) n->release_claim(exclusive_);
  held_.clear();
  if (step_) step_->claimed.store(false, std::memory_order_release);
  step_ = nullptr;
}

void Node::substitute_saved(std::size_t j, const Tensor& copy) {
  GW_CHECK(!released() && j < saved_.size() && saved_[j].tensor.defined() && copy.defined() &&
               copy.shape() == saved_[j].tensor.shape() && copy.dtype() == saved_[j].tensor.dtype(),
           "Node::substitute_saved: ", label(), " has no saved tensor ", j, " like ",
           copy.defined() ? copy.str() : std::string("an undefined tensor"));
  if (saved_storages_[j]) {
    saved_storages_[j]->note_saved(-1);
    saved_storages_[j]->forget_step_save(step_reads_.get());
  }
  saved_[j].tensor = copy.detach();
  saved_[j].version = copy.version();
  saved_storages_[j] = copy.storage().get();
  saved_storages_[j]->note_saved(+1);
  if (step_reads_) saved_storages_[j]->note_step_save(step_reads_);
}

namespace debug {
std::size_t live_nodes() {
  return g_live_nodes.load(std::memory_order_relaxed);
}
}  // namespace debug

bool grad_mode_enabled() {
  return t_grad_mode;
}
NoGradGuard::NoGradGuard() : previous_(t_grad_mode) {
  t_grad_mode = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_mode = previous_;
}

std::shared_ptr<Node> make_node(std::string name, Device device, cudaStream_t stream,
                                std::vector<InputMeta> inputs, Shape output_shape,
                                Node::BackwardFn backward) {
  return std::make_shared<Node>(std::move(name), device, stream, std::move(inputs),
                                std::vector<SavedTensor>{}, std::move(output_shape),
                                std::move(backward));
}

namespace autograd_detail {

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  return needs_grad(std::span<const Tensor* const>(inputs.begin(), inputs.size()));
}

bool needs_grad(std::span<const Tensor* const> inputs) {
  if (!t_grad_mode) return false;
  // Note [Host state of a captured step]: a capture notes every leaf whose requires_grad decides.
  if (HostStateLog* log = detail::host_state_log()) [[unlikely]] {
    for (const Tensor* t : inputs) {
      if (t && t->defined() && t->is_leaf()) detail::note_requires_grad(*log, *t);
    }
  }
  for (const Tensor* t : inputs) {
    if (t && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

SavedTensor save(const char* name, const Tensor& t) {
  if (!t.defined()) return {name, Tensor(), 0};
  return {name, t.detach(), t.version()};
}

void record(const char* op, const Tensor& output, std::initializer_list<const Tensor*> inputs,
            std::vector<SavedTensor> saved, Node::BackwardFn backward,
            std::initializer_list<NodeAttribute> attributes) {
  record(op, output, std::span<const Tensor* const>(inputs.begin(), inputs.size()),
         std::move(saved), std::move(backward), attributes);
}

void record(const char* op, const Tensor& output, std::span<const Tensor* const> inputs,
            std::vector<SavedTensor> saved, Node::BackwardFn backward,
            std::initializer_list<NodeAttribute> attributes) {
  std::vector<InputMeta> metas;
  metas.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    InputMeta m{t->shape(), t->dtype(), t->device(), t->storage()->producer_stream(), {}};
    if (t->requires_grad()) {
      if (t->grad_fn()) {
        m.edge.node = t->grad_fn();
      } else {
        m.edge.leaf = *t;
      }
    }
    metas.push_back(std::move(m));
  }
  // Note [Input slots]: which saved tensors are inputs that entered the tape from outside (no
  // gradient, not an activation's memory): what a replayed backward may read through a slot.
  std::uint64_t from_outside = 0;
  for (std::size_t j = 0; j < saved.size() && j < 64; ++j) {
    const Tensor& st = saved[j].tensor;
    if (!st.defined() || st.storage()->recorded()) continue;
    for (const Tensor* t : inputs) {
      if (t->storage() == st.storage() && !t->requires_grad()) {
        from_outside |= std::uint64_t{1} << j;
        break;
      }
    }
  }
  output.storage()->mark_recorded();
  auto node = std::make_shared<Node>(
      op, output.device(), output.storage()->producer_stream(), std::move(metas), std::move(saved),
      output.shape(), std::move(backward),
      std::span<const NodeAttribute>(attributes.begin(), attributes.size()));
  node->set_saved_from_outside(from_outside);
  output.set_grad_fn(std::move(node));
}

}  // namespace autograd_detail
}  // namespace graphward
