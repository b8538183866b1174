#include "graphward/capture/step_graph.h"
#include "graphward/capture/stream_capture.h"

#include <optional>
#include <unordered_set>

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/engine/tape/host_state.h"

namespace graphward {

namespace {
// A tensor as the graph baked it in.
struct Baked {
  Tensor tensor;
  const void* data = nullptr;
  Shape shape;
  DType dtype = DType::kFloat32;
};
[[maybe_unused]] Baked bake(const Tensor& t) {
  return {t, t.defined() ? t.raw_data() : nullptr, t.defined() ? t.shape() : Shape{},
          t.defined() ? t.dtype() : DType::kFloat32};
}
}  // namespace

struct StepGraph::Executable {
  // The graph's memory: declared first, destroyed last (the loss lives in it).
  std::unique_ptr<GraphMemoryPool> pool;
#if GRAPHWARD_HAS_CUDA
  capture::Graph graph;  // destroyed before the pool, after the tensors below (the destructor)
#endif
  Tensor loss;
  std::vector<Baked> inputs;
  // Note [Step inputs]: the batch's slots (graph-owned memory), and whether the graph was
  // captured by run(batch, step) at all.
  std::vector<Tensor> slots;
  bool batched = false;
  std::uint64_t replays = 0;  // launches of this executable
  std::vector<Baked> leaves, grads;  // the leaves the backward reaches, and their .grads
  // Note [Memory from outside a capture]: the memory the step used that its graph did not
  // allocate, and whether it wrote it.
  std::vector<CaptureUseLog::Use> uses;
  // Note [Host state of a captured step]: what the step's decisions read.
  HostStateLog host_state;
  // What a kernel fault after a launch names (Note [Kernel faults], base/error.h).
  std::shared_ptr<const std::string> description;
  Executable() = default;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  ~Executable() {
    loss = Tensor();
    leaves.clear();
    grads.clear();
    host_state = HostStateLog();
#if GRAPHWARD_HAS_CUDA
    graph = capture::Graph();
#endif
  }
};

StepGraph::StepGraph(Device device, std::vector<Tensor> inputs, StepGraphOptions options)
    : device_(device), inputs_(std::move(inputs)), options_(options) {
  if (device.is_cuda()) check_cuda_device(device, "StepGraph");
  GW_CHECK(options.warmup >= 1 || device.is_cpu() || options.force_eager,
           "StepGraph: warmup is ", options.warmup,
           "; expected at least 1 eager step before the capture (cuBLAS handles, GEMM plans, "
           "workspaces and the .grads must be made outside a capture)");
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    GW_CHECK(inputs_[i].defined() && inputs_[i].device() == device, "StepGraph: input ", i,
             " is ", inputs_[i].defined() ? inputs_[i].str() : std::string("undefined"),
             "; expected a tensor on ", device.str(), " (a static slot the step reads)");
  }
}

StepGraph::~StepGraph() = default;

void StepGraph::recapture() {
  std::lock_guard<std::mutex> lock(mutex_);
  exec_.reset();
}

std::string StepGraph::check_signature(const std::vector<Tensor>* batch) const {
  const Executable& e = *exec_;
  if (e.batched != (batch != nullptr)) {
    return batch ? "run() was given a batch; the graph was captured without one"
                 : "run() was given no batch; the graph was captured with one";
  }
  if (batch) {
    if (batch->size() != e.slots.size()) {
      return "the batch has " + std::to_string(batch->size()) + " tensors; the graph's slots " +
             std::to_string(e.slots.size());
    }
    for (std::size_t i = 0; i < batch->size(); ++i) {
      const Tensor& t = (*batch)[i];
      const Tensor& slot = e.slots[i];
      if (t.shape() != slot.shape() || t.dtype() != slot.dtype()) {
        return "batch tensor " + std::to_string(i) + " is " + t.str() + "; its slot holds " +
               slot.str();
      }
    }
  }
  if (inputs_.size() != e.inputs.size()) return "the number of inputs changed";
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    const Tensor& t = inputs_[i];
    const Baked& b = e.inputs[i];
    if (t.raw_data() != b.data || t.shape() != b.shape || t.dtype() != b.dtype) {
      return "input " + std::to_string(i) + " is " + t.str() + ", captured as " +
             shape_str(b.shape) + " at another address or dtype";
    }
  }
  for (std::size_t i = 0; i < e.leaves.size(); ++i) {
    const Tensor& leaf = e.leaves[i].tensor;
    if (leaf.raw_data() != e.leaves[i].data || leaf.shape() != e.leaves[i].shape) {
      return "parameter " + leaf.str() + " moved or changed shape since the capture";
    }
    const Tensor& g = leaf.grad();
    if (!g.defined() || g.raw_data() != e.grads[i].data) {
      return "the .grad of parameter " + leaf.str() +
             (g.defined() ? " is another tensor" : " is undefined") +
             " (the graph writes the one it captured, in place)";
    }
  }
  return e.host_state.change();  // Note [Host state of a captured step]
}

Tensor StepGraph::run(const std::function<Tensor()>& step) {
  GW_CHECK(static_cast<bool>(step), "StepGraph::run: expected a step function, got an empty one");
  return run_impl(nullptr, [&step](const std::vector<Tensor>&) { return step(); });
}

Tensor StepGraph::run(const std::vector<Tensor>& batch, const BatchStep& step) {
  GW_CHECK(static_cast<bool>(step), "StepGraph::run: expected a step function, got an empty one");
  for (std::size_t i = 0; i < batch.size(); ++i) {
    GW_CHECK(batch[i].defined() && batch[i].device() == device_, "StepGraph::run: batch tensor ",
             i, " is ", batch[i].defined() ? batch[i].str() : std::string("undefined"),
             "; expected a tensor on ", device_.str());
  }
  return run_impl(&batch, step);
}

namespace {
// What every run() returns, eager or captured: the step's loss, on the step's device.
void check_loss(const Tensor& loss, Device device) {
  GW_CHECK(loss.defined() && loss.device() == device, "StepGraph: the step returned ",
           loss.defined() ? loss.str() : std::string("nothing (an undefined tensor)"),
           "; expected its loss, a tensor on ", device.str());
}
}  // namespace

Tensor StepGraph::run_impl(const std::vector<Tensor>* batch, const BatchStep& step) {
  static const std::vector<Tensor> kNoBatch;
  std::lock_guard<std::mutex> lock(mutex_);
  [[maybe_unused]] const std::thread::id me = std::this_thread::get_id();
  ++calls_;
  bool eager = device_.is_cpu() || options_.force_eager ||
               calls_ <= static_cast<std::uint64_t>(options_.warmup);
#if GRAPHWARD_HAS_CUDA
  cudaStream_t caller = nullptr;
  std::string why;
  if (!eager) {
    caller = current_stream(device_);
    why = !exec_                   ? (pending_reason_.empty() ? "first capture" : pending_reason_)
          : captured_thread_ != me ? "run() on another thread than the one that captured the "
                                     "graph (a graph serves its capturing thread)"
                                   : check_signature(batch);
    // A capture on a stream (or a thread) no step of this graph ran on would make the stream's
    // library handles inside the capture, which cuBLAS refuses: one eager step there first, the
    // capture next call.
    if (!why.empty() && (caller != warmed_stream_ || warmed_thread_ != me)) {
      exec_.reset();
      pending_reason_ = why;
      eager = true;
    }
  }
#endif
  if (eager) {
    ++counters_.eager;
    // A warm-up of a step to be captured splits its backward as the capture will (its side
    // streams' handles are made here, outside the capture).
    std::optional<WholeStepScope> whole;
    if (!device_.is_cpu() && !options_.force_eager) whole.emplace();
    Tensor loss = step(batch ? *batch : kNoBatch);
    check_loss(loss, device_);
#if GRAPHWARD_HAS_CUDA
    if (whole) {
      warmed_stream_ = current_stream(device_);
      warmed_thread_ = me;
    }
#endif
    return loss;
  }
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device_);
  if (!why.empty()) {
    exec_.reset();
    last_reason_ = why;
    pending_reason_.clear();
    (void)capture(batch, step, caller);
    captured_thread_ = me;
  }
  launch(batch, caller);
  return exec_->loss;
#else
  ++counters_.eager;
  Tensor loss = step(batch ? *batch : kNoBatch);
  check_loss(loss, device_);
  return loss;
#endif
}

#if GRAPHWARD_HAS_CUDA
namespace {
// Note [Step inputs]: `batch` into `slots` on `stream`, after each tensor's producer.
void copy_batch(const std::vector<Tensor>& batch, const std::vector<Tensor>& slots,
                cudaStream_t stream) {
  capture::SlotRefresh refresh(stream);
  for (std::size_t i = 0; i < batch.size(); ++i) refresh.add(slots[i], batch[i]);
  refresh.flush();
}

// The leaves the tape of `loss` reaches (each once).
std::vector<Tensor> reached_leaves(const Tensor& loss) {
  std::vector<Tensor> leaves;
  std::unordered_set<const Node*> seen;
  std::unordered_set<const void*> seen_leaf;
  std::vector<const Node*> todo;
  if (loss.grad_fn()) todo.push_back(loss.grad_fn().get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const InputMeta& in : n->inputs()) {
      if (in.edge.node) todo.push_back(in.edge.node.get());
      if (in.edge.leaf.defined() && seen_leaf.insert(in.edge.leaf.storage().get()).second) {
        leaves.push_back(in.edge.leaf);
      }
    }
  }
  return leaves;
}
}  // namespace

namespace {
// The tensors a tape rooted at `loss` saved whose memory is one of `batch`'s: a step function
// that read the batch itself rather than the slots it was given (Note [Step inputs]).
std::string batch_read_in_place(const Tensor& loss, const std::vector<Tensor>& batch) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> todo;
  std::vector<const Node*> reader(batch.size(), nullptr);
  if (loss.grad_fn()) todo.push_back(loss.grad_fn().get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const auto& [address, j] : n->record().saved_addresses) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto* begin = static_cast<const char*>(batch[i].storage()->data());
        const auto a = reinterpret_cast<const char*>(address);
        if (!reader[i] && a >= begin &&
            a < begin + std::max<std::size_t>(batch[i].storage()->bytes(), 1)) {
          reader[i] = n;
        }
      }
    }
    for (const InputMeta& in : n->inputs()) {
      if (in.edge.node) todo.push_back(in.edge.node.get());
    }
  }
  std::string out;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!reader[i]) continue;
    out += detail::concat(out.empty() ? "" : "; ", "batch tensor ", i, " (", batch[i].str(),
                          ") was read by ", reader[i]->label(), " itself");
  }
  if (!out.empty()) {
    out += ", not through the slot the step function was given: every replay would read this "
           "step's batch";
  }
  return out;
}

}  // namespace

Tensor StepGraph::capture(const std::vector<Tensor>* batch, const BatchStep& step,
                          cudaStream_t caller) {
  detail::NvtxRange nvtx("StepGraph::capture");
  auto fresh = std::make_unique<Executable>();
  fresh->pool = std::make_unique<GraphMemoryPool>(device_);
  // Rule [read after write] for the capture itself: what the step reads was made on S or ordered
  // before S.
  for (const Tensor& t : inputs_) t.storage()->sync_for_read(caller);
  // Note [Step inputs]: the batch's slots, memory of the executable's own (outside the step arena,
  // the block cache and the graph's pool), filled with this step's batch before the capture.
  if (batch) {
    fresh->batched = true;
    for (const Tensor& t : *batch) fresh->slots.push_back(capture::input_slot_like(t, device_, caller));
    copy_batch(*batch, fresh->slots, caller);
  }
  Tensor loss;
  CaptureUseLog log;
  std::vector<std::shared_ptr<ReplayWatcher>> watchers;  // Note [Watched replays]
  capture::Graph graph(capture::capture_stream(
      caller, "StepGraph",
      "some work in the step was not capturable, used a stream outside the "
      "capture, or was left on another stream without joining the step's stream",
      [&] {
        CaptureModeScope scope("a whole training step (StepGraph)");
        CaptureUsesScope uses(log);  // Note [Memory from outside a capture]
        WholeStepScope whole;
        HostStateScope host_state(fresh->host_state);
        GraphPoolScope pool_scope(*fresh->pool);
        loss = step(fresh->slots);
        check_loss(loss, device_);
      },
      &watchers));
  if (batch) {
    const std::string misread = batch_read_in_place(loss, *batch);
    if (!misread.empty()) {
      GW_CHECK(false, "StepGraph::run: ", misread, "; read the batch from the step function's "
               "argument (run(batch, [&](const std::vector<Tensor>& in) { ... in[i] ... }))");
    }
  }
  graph.instantiate();
  fresh->graph = std::move(graph);
  // Note [Memory from outside a capture]: the first launch waits for the outside work the capture
  // did not; every launch for the memory's users since the last.
  for (const Event& e : log.outside) e.block(caller);
  for (const auto& fence : log.fences) fence->block(caller);
  const capture::NodeCounts counts = capture::count_nodes(fresh->graph.graph());
  kernel_nodes_ = counts.kernels;
  graph_nodes_ = counts.nodes.size();
  topology_ = capture::topology_of(fresh->graph.graph(), counts.nodes);
  fresh->description = std::make_shared<const std::string>(
      detail::concat("the whole-step graph of a StepGraph captured at run() call ", calls_, " (",
                     kernel_nodes_, " kernel nodes)"));
  fresh->graph.watch(std::move(watchers), fresh->description);
  fresh->loss = loss;
  for (const Tensor& t : inputs_) fresh->inputs.push_back(bake(t));
  for (const Tensor& leaf : reached_leaves(loss)) {
    fresh->leaves.push_back(bake(leaf));
    fresh->grads.push_back(bake(leaf.grad()));
  }
  // Of the logged memory, what launch() does not order and record already: the parameters and
  // their .grads it takes as written, the inputs and the slots as read.
  std::unordered_set<const Storage*> written, read;
  for (const std::vector<Baked>* v : {&fresh->leaves, &fresh->grads}) {
    for (const Baked& b : *v) {
      if (b.tensor.defined()) written.insert(b.tensor.storage().get());
    }
  }
  for (const Tensor& t : inputs_) read.insert(t.storage().get());
  for (const Tensor& t : fresh->slots) read.insert(t.storage().get());
  for (CaptureUseLog::Use& u : log.uses) {
    const Storage* st = u.storage.get();
    if (!written.count(st) && (u.wrote || !read.count(st))) fresh->uses.push_back(std::move(u));
  }
  exec_ = std::move(fresh);
  ++counters_.captures;
  // What the capture recorded ran nothing: check that the graph can be replayed as captured (a
  // .grad the step created inside the capture is graph memory, rewritten by each replay: fine).
  const std::string why = check_signature(batch);
  GW_CHECK(why.empty(), "StepGraph: internal error: the graph's signature fails right after its "
                        "capture: ", why);
  return exec_->loss;
}

void StepGraph::launch(const std::vector<Tensor>* batch, cudaStream_t caller) {
  Executable& e = *exec_;
  // Note [Step inputs]: this step's batch into the slots (the capturing step filled them already).
  if (batch && e.replays > 0) copy_batch(*batch, e.slots, caller);
  ++e.replays;
  // Rule [read after write]: S waits for the inputs' producers and for the other users of what the
  // graph writes.
  for (const Tensor& t : inputs_) t.storage()->sync_for_read(caller);
  for (std::size_t i = 0; i < e.leaves.size(); ++i) {
    e.leaves[i].tensor.storage()->sync_for_write(caller);
    e.leaves[i].tensor.grad().storage()->sync_for_write(caller);
  }
  for (const CaptureUseLog::Use& u : e.uses) {
    u.wrote ? u.storage->sync_for_write(caller) : u.storage->sync_for_read(caller);
  }
  {
    detail::NvtxRange nvtx("StepGraph::replay");
    e.graph.launch(caller);
  }
  detail::note_graph_launch(e.description);  // Note [Kernel faults]
  ++counters_.replays;
  // The graph read the inputs and wrote the parameters, their .grads and the loss on S.
  for (const Tensor& t : inputs_) t.storage()->record_use(caller, false);
  if (batch) {
    for (const Tensor& t : *batch) t.storage()->record_use(caller, false);
  }
  for (std::size_t i = 0; i < e.leaves.size(); ++i) {
    e.leaves[i].tensor.storage()->record_use(caller, true);
    e.leaves[i].tensor.bump_version();
    e.leaves[i].tensor.grad().storage()->record_use(caller, true);
  }
  e.loss.storage()->record_use(caller, true);
  for (const CaptureUseLog::Use& u : e.uses) u.storage->record_use(caller, u.wrote);
}
#endif

void StepGraph::write_dot(const std::string& path, bool verbose) const {
  std::lock_guard<std::mutex> lock(mutex_);
  GW_CHECK(exec_,
           "StepGraph::write_dot: no graph has been captured yet (the first run() that "
           "captures is the warm-up's next)");
#if GRAPHWARD_HAS_CUDA
  const unsigned flags = verbose ? static_cast<unsigned>(cudaGraphDebugDotFlagsVerbose) : 0u;
  exec_->graph.write_dot(path, flags);
#else
  (void)path, (void)verbose;
#endif
}

}  // namespace graphward
