#include "graphward/engine/backward/backward.h"

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/nvtx.h"

#include "graphward/engine/backward/backward_program.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/ops/ops.h"
#include "graphward/engine/runtime/blas.h"

namespace graphward {

// ---- EagerExecutor ------------------------------------------------------------------------------

Event& EagerExecutor::event(Device device, int i) {
  if (!(events_device_ == device)) {
    events_.clear();
    timing_events_.clear();
    side_streams_.clear();
    events_device_ = device;
  }
  while (static_cast<int>(events_.size()) <= i) events_.emplace_back(device);
  return events_[i];
}

cudaStream_t EagerExecutor::side_stream(Device device, int i) {
  event(device, 0);  // resets the pools when the device changes
  while (static_cast<int>(side_streams_.size()) <= i) side_streams_.emplace_back(device);
  return side_streams_[static_cast<std::size_t>(i)].get();
}

bool EagerExecutor::side_streams_ready(const BackwardPlan& plan, Device device) const {
  for (std::size_t i = 0; i < plan.streams.size(); ++i) {
    if (plan.streams[i] || i >= plan.side_of.size() || plan.side_of[i] < 0) continue;
#if GRAPHWARD_HAS_CUDA
    if (!(events_device_ == device) || i >= side_streams_.size() ||
        !has_blas_context(device, side_streams_[i].get())) {
      return false;
    }
#else
    (void)device;
    return false;
#endif
  }
  return true;
}

Event& EagerExecutor::timing_event(Device device, int i) {
  event(device, 0);  // resets both pools when the device changes
  while (static_cast<int>(timing_events_.size()) <= i) timing_events_.emplace_back(device, true);
  return timing_events_[i];
}

std::uint64_t detail::fnv1a(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t detail::hash_layout(const Tensor& t, std::uint64_t h) {
  const std::uint64_t head[2] = {static_cast<std::uint64_t>(t.dtype()), t.shape().size()};
  h = fnv1a(head, sizeof head, h);
  return fnv1a(t.shape().data(), t.shape().size() * sizeof(std::int64_t), h);
}

namespace {
// Note [Gradient reduction]: a hash of the buckets' layout (every gradient's dtype and shape, and
// where the buckets end) and a readable account of it, for the reducer's agreement check.
std::uint64_t bucket_layout_hash(const BackwardPlan& plan, const std::vector<GradBucket>& buckets) {
  const std::size_t count = buckets.size();
  std::uint64_t h = detail::fnv1a(&count, sizeof count);
  for (const GradBucket& b : buckets) {
    const std::size_t n = b.buffers.size();
    h = detail::fnv1a(&n, sizeof n, h);
    for (int i : b.buffers) h = detail::hash_layout(plan.buffers[i].leaf, h);
  }
  return h;
}

std::string describe_buckets(const BackwardPlan& plan, const std::vector<GradBucket>& buckets) {
  std::size_t grads = 0, bytes = 0;
  for (const GradBucket& b : buckets) {
    grads += b.buffers.size();
    bytes += b.bytes;
  }
  std::string out = detail::concat(grads, " gradients (", bytes, " bytes) in ", buckets.size(),
                                   " bucket", buckets.size() == 1 ? "" : "s", ": ");
  for (std::size_t k = 0; k < buckets.size() && k < 8; ++k) {
    out += k ? " | " : "";
    for (std::size_t j = 0; j < buckets[k].buffers.size() && j < 6; ++j) {
      out += (j ? ", " : "") + plan.buffers[buckets[k].buffers[j]].leaf.str();
    }
    if (buckets[k].buffers.size() > 6) out += ", ...";
  }
  if (buckets.size() > 8) out += " | ...";
  return out;
}
}  // namespace

std::vector<StepTiming> EagerExecutor::read_timings(const BackwardPlan& plan, Device device) {
  std::vector<StepTiming> out;
  const std::size_t n = plan.steps.size();
  GW_CHECK(host_us_.size() == n, "EagerExecutor::read_timings: no timed run of this plan");
  const Event& origin = timing_event(device, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(i);
    const BackwardPlan::Step& step = plan.steps[i];
    StepTiming t{k,
                 step.stream,
                 step.node->label(),
                 timing_event(device, 1 + 2 * k).elapsed_ms_since(origin),
                 timing_event(device, 2 + 2 * k).elapsed_ms_since(origin),
                 host_us_[i]};
    if (step.side_stream >= 0) {
      const int side = 1 + 2 * static_cast<int>(n) + 2 * k;
      t.side_stream = step.side_stream;
      t.side_start_ms = timing_event(device, side).elapsed_ms_since(origin);
      t.side_end_ms = timing_event(device, side + 1).elapsed_ms_since(origin);
    }
    out.push_back(std::move(t));
  }
  // Note [Gradient reduction]: each bucket's reduction, on a track of its own past the plan's
  // streams (stream_names(plan, true) names it).
  const int reduction_track = static_cast<int>(plan.streams.size());
  for (std::size_t b = 0; b < timed_buckets_.size(); ++b) {
    const int k = 1 + 4 * static_cast<int>(n) + 2 * static_cast<int>(b);
    StepTiming t{static_cast<int>(n + b),
                 reduction_track,
                 detail::concat("reduce bucket ", b + 1, " of ", timed_buckets_.size(), " (",
                                timed_buckets_[b].first, " gradients, ",
                                timed_buckets_[b].second / 1024, " KiB)"),
                 timing_event(device, k).elapsed_ms_since(origin),
                 timing_event(device, k + 1).elapsed_ms_since(origin),
                 0};
    out.push_back(std::move(t));
  }
  return out;
}

#if GRAPHWARD_HAS_CUDA
namespace {
// Note [Kernel faults]: the localizing executor's check after `what` ran on `streams`.
void check_finished(std::initializer_list<cudaStream_t> streams, const std::string& what) {
  for (cudaStream_t s : streams) {
    const cudaError_t err = cudaStreamSynchronize(s);
    if (err == cudaSuccess) continue;
    if (!is_sticky_cuda_error(err)) (void)cudaGetLastError();
    throw CudaError(
        detail::concat("graphward: ", what, " failed: CUDA error ", cudaGetErrorName(err), " (",
                       cudaGetErrorString(err), ")",
                       is_sticky_cuda_error(err)
                           ? ". The CUDA context of this process is lost (Note [Kernel faults]): "
                             "fix the fault and restart the process"
                           : ""),
        static_cast<int>(err));
  }
}
}  // namespace
#endif

// Note [Leaves shared across threads]
// Two threads may run backwards that reach the same leaf (a shared parameter): each adds into the
// one .grad, and unordered additions lose contributions (a read-modify-write race), or both make
// the .grad at once. A backward therefore holds a claim on every leaf it writes (on the leaf's
// storage) from its first write to its last: a second backward that reaches a claimed leaf waits
// until the first is done, so the two run one after the other and every contribution arrives, as
// PyTorch's locked accumulation gives. Claims are taken in one global order (by address) when the
// fast path — each claim free, in plan order — fails, so two backwards never wait on each other.
// Uncontended, the cost is one atomic exchange and one store a leaf a backward. On CUDA the claim
// orders the host's enqueues; the work itself is ordered by the streams' contract (rule [fork and
// join]: the first backward's gradients are complete on its caller's stream, which the second
// caller's stream must follow for .grad, Note [Planned synchronization]).
class LeafClaims {
 public:
  explicit LeafClaims(const BackwardPlan& plan) {
    for (const BackwardPlan::Buffer& b : plan.buffers) {
      if (b.kind == BackwardPlan::BufferKind::kLeaf) held_.push_back(b.leaf.storage().get());
    }
    for (std::size_t i = 0; i < held_.size(); ++i) {
      if (!held_[i]->try_claim_grad()) {
        // A leaf twice in the plan (not expected) or claimed by another backward: give back what
        // this one holds and take them all in address order, waiting where needed.
        for (std::size_t j = 0; j < i; ++j) held_[j]->release_grad_claim();
        std::sort(held_.begin(), held_.end());
        held_.erase(std::unique(held_.begin(), held_.end()), held_.end());
        for (const Storage* st : held_) st->claim_grad();
        return;
      }
    }
  }
  ~LeafClaims() {
    for (const Storage* st : held_) st->release_grad_claim();
  }
  LeafClaims(const LeafClaims&) = delete;
  LeafClaims& operator=(const LeafClaims&) = delete;

 private:
  std::vector<const Storage*> held_;
};

// What a run adds around its instructions (Note [The backward program]).
class EagerExecutor::Observer {
 public:
  virtual ~Observer() = default;
  virtual void start(Run&) {}
  virtual void before(Run&, const BackwardInstr&) {}
  virtual void after(Run&, const BackwardInstr&) {}
};

// One run of a plan: what it holds while it runs, and how it runs each instruction of the plan's
// program (Note [The backward program], backward_program.h).
struct EagerExecutor::Run {
  using Kind = BackwardPlan::BufferKind;
  using Op = BackwardInstr::Op;
  Run(EagerExecutor& executor, const BackwardPlan& p, Device d, RunKind k, GradientReducer* r)
      : ex(executor),
        plan(p),
        device(d),
        gpu(d.is_cuda()),
        in_capture(k == RunKind::kInCapture),
        release_saved(k == RunKind::kEagerReleasing),
        reducer(r),
        num_steps(static_cast<int>(p.steps.size())) {}

  EagerExecutor& ex;
  const BackwardPlan& plan;
  const Device device;
  const bool gpu;
  const bool in_capture, release_saved;
  GradientReducer* const reducer;
  const int num_steps;
  BackwardProgram program;
  // The plan's streams with this executor's own side streams, then the reducer's.
  std::vector<cudaStream_t> streams;
  cudaStream_t caller = nullptr;
  std::vector<Tensor> scaled_seeds;
  const std::vector<Tensor>* seeds = nullptr;
  std::vector<Tensor> buffers;  // the plan's gradient buffers
  // The step being run: its gradient, its slots (the side part's apart), its epilogue.
  Tensor* grad = nullptr;
  std::vector<GradSlot> slots, side_slots;
  GradEpilogue epilogue;
  std::optional<detail::NvtxRange> nvtx_step;
  std::optional<StreamGuard> step_guard;

  // Note [Check, then write]: refuses before launching anything.
  void check_inputs() const {
    for (const BackwardPlan::Step& s : plan.steps) s.node->check_saved();
    for (const BackwardPlan::Buffer& b : plan.buffers) {
      if (b.kind != Kind::kLeaf || !b.leaf.grad().defined()) continue;
      const Tensor& g = b.leaf.grad();
      GW_CHECK(g.shape() == b.leaf.shape() && g.dtype() == b.leaf.dtype() &&
                   g.device() == b.leaf.device(),
               "backward: the .grad of leaf ", b.leaf.str(), " is ", g.str(),
               "; expected the leaf's shape, dtype and device");
    }
  }

  // The program; with a reducer, its buckets: the layout every process must share is agreed
  // before anything is written (Note [Gradient reduction]).
  void lower() {
    std::vector<GradBucket> buckets;
    if (reducer) {
      buckets = plan_grad_buckets(plan, reducer->bucket_bytes(), reducer->first_bucket_bytes());
      reducer->agree(bucket_layout_hash(plan, buckets), describe_buckets(plan, buckets),
                     capturing());
    }
    program = lower_plan(plan, std::move(buckets), gpu);
  }

  void open_streams() {
    streams = plan.streams;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (gpu && !streams[i] && i < plan.side_of.size() && plan.side_of[i] >= 0) {
        streams[i] = ex.side_stream(device, static_cast<int>(i));
      }
    }
    caller = streams[0];
    cudaStream_t comm = reducer && gpu ? reducer->stream() : nullptr;
    GW_CHECK(!reducer || !gpu || comm, "backward: the gradient reducer has no stream for ",
             device.str());
    streams.push_back(comm);  // reduce_stream(plan)
  }

  // Seeds made elsewhere are read on the caller's stream (rule [read after write]). Note [Summed
  // reductions] (dist/process_group.h): a reducer that sums its buckets gets every gradient already
  // divided by the world size, through the seeds (the backward is linear in them); scaled on the
  // caller's stream, captured with the rest.
  void take_seeds(const std::vector<Tensor>& seeds_in) {
    if (gpu) {
      for (const Tensor& s : seeds_in) s.storage()->sync_for_read(caller);
    }
    const double seed_scale = reducer ? reducer->begin_backward(plan.grad_write) : 1.0;
    if (seed_scale != 1.0) {
      NoGradGuard no_grad;
      std::optional<StreamGuard> guard;
      if (gpu) guard.emplace(device, caller, StreamGuard::Recorded{});
      for (const Tensor& s : seeds_in) scaled_seeds.push_back(mul(s, seed_scale));
    }
    seeds = scaled_seeds.empty() ? &seeds_in : &scaled_seeds;
  }

  // Note [Frees at the join] (engine/runtime/memory.h): memory used on several of the joined streams is
  // cached on the caller's stream after the join, not ordered free by free.
  void open_joined_frees(std::optional<detail::JoinedFrees>& joined_frees) const {
    if (!gpu || in_capture || (plan.joins.empty() && plan.moved_streams.empty())) return;
    std::vector<cudaStream_t> joined;
    for (int j : plan.joins) joined.push_back(streams[j]);
    if (!program.buckets.empty()) joined.push_back(streams.back());
    joined_frees.emplace(device, caller, joined, plan.moved_streams);
  }

  void exec(const BackwardInstr& in) {
    const BackwardPlan::Step* step =
        in.step >= 0 ? &plan.steps[static_cast<std::size_t>(in.step)] : nullptr;
    switch (in.op) {
      case Op::kSeedLeaf: {
        const BackwardPlan::LeafSeed& ls = plan.leaf_seeds[in.index];
        std::optional<StreamGuard> guard;
        if (gpu) guard.emplace(device, caller, StreamGuard::Recorded{});
        scale_backward((*seeds)[ls.root], 1.0,
                       {&plan.buffers[ls.buffer].leaf.grad(), ls.accumulate});
        break;
      }
      case Op::kWaitStream:
        stream_wait_stream(device, caller, plan.caller_waits[in.index]);
        break;
      case Op::kRecord: ex.event(device, in.event).record(streams[in.stream]); break;
      case Op::kWait: ex.event(device, in.event).block(streams[in.stream]); break;
      case Op::kGather: gather(*step); break;
      case Op::kRunSide: run_side(*step); break;
      case Op::kRun: run_node(*step, slots); break;
      // Nothing reads a node's saved tensors after its step: free them now, as PyTorch does, so
      // that the activations' memory is back in the pool for the rest of the backward (rule
      // [reuse after use] orders each free after the streams that read it; Note [A failed
      // backward] says why not at the end).
      case Op::kRelease:
        if (release_saved) step->node->release_saved();
        break;
      case Op::kDrop:  // last use: rule [reuse after use] keeps it until every stream is done
        *grad = Tensor();
        grad = nullptr;
        epilogue = GradEpilogue{};
        break;
      case Op::kReduce: reduce(program.buckets[static_cast<std::size_t>(in.index)]); break;
    }
  }

  // The gradient of the step's node's output (direct writes so far, plus seeds and staged
  // buffers), on the step's stream; then where the step writes each input's gradient.
  void gather(const BackwardPlan::Step& step) {
    Tensor& g = buffers[step.grad_buffer];
    const std::size_t pending = step.seeds.size() + step.staged.size();
    auto add_in = [&](const Tensor& part, bool owned) {
      if (!g.defined() && (owned || pending == 1)) {
        g = part;  // take it (a lone seed is only read)
      } else {
        scale_backward(part, 1.0, {&g, g.defined()});  // copy or add, on this stream
      }
    };
    for (int r : step.seeds) add_in((*seeds)[r], false);
    for (int b : step.staged) {
      add_in(buffers[b], true);
      buffers[b] = Tensor();
    }
    GW_CHECK(g.defined(), "backward: no gradient reached ", step.node->label(),
             " (an internal error of the plan)");
    grad = &g;
    fill_slots(step);
  }

  void fill_slots(const BackwardPlan::Step& step) {
    slots.assign(step.writes.size(), GradSlot{});
    for (std::size_t i = 0; i < step.writes.size(); ++i) {
      const BackwardPlan::Write& w = step.writes[i];
      if (w.buffer < 0) continue;
      const BackwardPlan::Buffer& b = plan.buffers[w.buffer];
      // A gradient buffer written by this step alone is only read after it: an op may store a
      // gradient equal to its grad_out there without a copy (GradSlot::may_share). Never a leaf's
      // .grad (persistent, accumulated by later backwards) or a staged buffer (added into its
      // target in place).
      const bool share = b.kind == Kind::kGrad && b.contributors.size() == 1 && !w.accumulate;
      slots[i] = {b.kind == Kind::kLeaf ? &b.leaf.grad() : &buffers[w.buffer], w.accumulate, share};
    }
    // Note [Backward epilogue fusion] (engine/ops/ops.h): the input gradient of this step is the
    // pre-activation gradient of the layer that made its input.
    if (step.fuses_activation_of >= 0) {
      const Node& made = *plan.steps[step.fuses_activation_of].node;
      const Node::ActivationFusion& f = *made.activation_fusion();
      epilogue = GradEpilogue{};
      epilogue.act = f.act;
      epilogue.act_input = made.saved()[f.act_input_saved].tensor;
      if (f.relu_mask_saved >= 0) epilogue.relu_mask = made.saved()[f.relu_mask_saved].tensor;
      slots[0].epilogue = &epilogue;
    }
  }

  void run_node(const BackwardPlan::Step& step, std::span<GradSlot> part) {
    if (step.preactivation_grad) {
      step.node->apply_from_preactivation(*grad, part);
    } else {
      let_take_grad(step, part);
      step.node->apply(*grad, part);
    }
  }

  // A first write into a gradient buffer that later steps add into (so no GradSlot::may_share
  // from fill_slots) may still take the step's gradient itself — a residual add's pass-through,
  // whose sum the layer norm after it then adds into in place of a copy — where nothing else can
  // see that gradient once the step is done: its only handle and storage reference (no seed, no
  // other buffer sharing it), used on this step's stream alone (no side stream still reading
  // it), and no other slot of the step able to share it (an input of its elements and dtype). One
  // slot at most.
  void let_take_grad(const BackwardPlan::Step& step, std::span<GradSlot> part) {
    if (!grad->is_unique()) return;
    if (gpu && !grad->storage()->used_only_on(streams[step.stream])) return;
    const std::vector<InputMeta>& inputs = step.node->inputs();
    int candidate = -1;
    for (std::size_t i = 0; i < part.size() && i < inputs.size(); ++i) {
      if (!part[i].tensor) continue;
      // Its elements and dtype: reshape's gradient is grad_out's elements under another shape.
      const bool like_grad =
          shape_numel(inputs[i].shape) == grad->numel() && inputs[i].dtype == grad->dtype();
      if (!like_grad) continue;
      if (part[i].may_share) return;
      const BackwardPlan::Write& w = step.writes[i];
      if (w.buffer < 0 || w.accumulate) continue;
      const BackwardPlan::Buffer& b = plan.buffers[static_cast<std::size_t>(w.buffer)];
      if (b.kind != Kind::kGrad || b.contributors.size() < 2) continue;
      if (candidate >= 0) return;
      candidate = static_cast<int>(i);
    }
    if (candidate >= 0) part[static_cast<std::size_t>(candidate)].may_share = true;
  }

  // Weight-gradient parallelism: the node's leaf gradients on the step's side stream (the slots
  // of leaves move there); kRun then computes the rest on the step's stream.
  void run_side(const BackwardPlan::Step& step) {
    side_slots.assign(slots.size(), GradSlot{});
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const int b = step.writes[i].buffer;
      if (b >= 0 && plan.buffers[b].kind == Kind::kLeaf) std::swap(side_slots[i], slots[i]);
    }
    std::optional<StreamGuard> on_side;
    if (gpu) on_side.emplace(device, streams[step.side_stream], StreamGuard::Recorded{});
    run_node(step, side_slots);
  }

  // Note [Gradient reduction]: the bucket's gradients reduced on the reducer's stream, which has
  // waited for their writers (the instructions before this one).
  void reduce(const GradBucket& b) {
    const cudaStream_t comm = streams.back();
    for (int i : b.buffers) {
      const Tensor& g = plan.buffers[i].leaf.grad();
      GW_CHECK(g.defined(), "backward: the gradient of leaf ", plan.buffers[i].leaf.str(),
               " was not written (an internal error of the plan)");
      if (gpu)
        g.storage()->sync_for_write(comm);  // planned: records the use (rule [reuse after use])
    }
    if (!in_capture && !capturing()) {  // Note [Gradients in buckets]: eager only
      std::vector<Tensor*> places;
      places.reserve(b.buffers.size());
      for (int i : b.buffers) places.push_back(&plan.buffers[i].leaf.grad());
      reducer->place(places);
    }
    std::vector<Tensor> grads;
    grads.reserve(b.buffers.size());
    for (int i : b.buffers) grads.push_back(plan.buffers[i].leaf.grad());
    detail::NvtxRange nvtx_reduce("reduce gradients");
    reducer->reduce(grads);
  }

  // Runs instructions [begin, end), each between its observers' calls. A step's instructions run
  // with its stream current (the node's backward, its gradient's sums and frees) and inside its
  // NVTX range, from its first instruction to its kDrop.
  void exec_range(int begin, int end, std::span<Observer* const> observers, int* reached) {
    for (int i = begin; i < end; ++i) {
      const BackwardInstr& in = program.instrs[static_cast<std::size_t>(i)];
      if (in.step >= 0 && !nvtx_step) {
        if (reached) *reached = in.step;
        const BackwardPlan::Step& step = plan.steps[static_cast<std::size_t>(in.step)];
        nvtx_step.emplace(step.node->name().c_str());
        if (gpu) step_guard.emplace(device, streams[step.stream], StreamGuard::Recorded{});
      }
      for (Observer* o : observers) o->before(*this, in);
      exec(in);
      for (Observer* o : observers) o->after(*this, in);
      if (in.op == Op::kDrop) end_step();
    }
  }

  void end_step() {
    step_guard.reset();
    nvtx_step.reset();
  }
};

// A timed run: timing events around each step, its side part and each bucket's reduction (in a
// capture, nodes of the graph, recorded by every replay), and the host time of each step.
// Event 0 is the trace's origin; 1 + 2k and 2 + 2k step k's; 1 + 2n + 2k and 2 + 2n + 2k its side
// part's; 1 + 4n + 2b and 2 + 4n + 2b bucket b's reduction.
class EagerExecutor::Timing final : public Observer {
  using Op = BackwardInstr::Op;
  using Clock = std::chrono::steady_clock;
  void mark(Run& r, int i, int stream) {
    Event& e = r.ex.timing_event(r.device, i);
    r.in_capture ? e.record_external(r.streams[stream]) : e.record(r.streams[stream]);
  }
  int step_ = -1;
  Clock::time_point host_start_;

 public:
  void start(Run& r) override {
    mark(r, 0, 0);
    r.ex.host_us_.assign(r.plan.steps.size(), 0.0);
    for (const GradBucket& b : r.program.buckets) {
      r.ex.timed_buckets_.push_back({b.buffers.size(), b.bytes});
    }
  }
  void before(Run& r, const BackwardInstr& in) override {
    if (in.step >= 0 && in.step != step_) {
      step_ = in.step;
      host_start_ = Clock::now();
    }
    const int n = r.num_steps;
    if (in.op == Op::kRunSide) mark(r, 1 + 2 * n + 2 * in.step, in.stream);
    if (in.op == Op::kReduce) mark(r, 1 + 4 * n + 2 * in.index, in.stream);
  }
  void after(Run& r, const BackwardInstr& in) override {
    const int n = r.num_steps;
    switch (in.op) {
      case Op::kGather: mark(r, 1 + 2 * in.step, in.stream); break;
      case Op::kRunSide: mark(r, 2 + 2 * n + 2 * in.step, in.stream); break;
      case Op::kRelease: mark(r, 2 + 2 * in.step, in.stream); break;
      case Op::kReduce: mark(r, 2 + 4 * n + 2 * in.index, in.stream); break;
      case Op::kDrop:
        r.ex.host_us_[static_cast<std::size_t>(in.step)] =
            std::chrono::duration<double, std::micro>(Clock::now() - host_start_).count();
        break;
      default: break;
    }
  }
};

#if GRAPHWARD_HAS_CUDA
// Note [Kernel faults]: a run with localize_faults synchronizes after each step and each bucket's
// reduction, and names the one whose work failed.
class EagerExecutor::Localize final : public Observer {
  using Op = BackwardInstr::Op;

 public:
  void start(Run& r) override {
    check_finished({r.caller}, "work enqueued before the backward (not the backward)");
  }
  void after(Run& r, const BackwardInstr& in) override {
    if (in.op == Op::kRun) {
      const BackwardPlan::Step& step = r.plan.steps[static_cast<std::size_t>(in.step)];
      const std::string what =
          detail::concat("the backward of ", step.node->label(), " (step ", in.step + 1, " of ",
                         r.num_steps, " of the plan, on stream ", step.stream, ")");
      if (step.side_stream >= 0) {
        check_finished({r.streams[step.stream], r.streams[step.side_stream]}, what);
      } else {
        check_finished({r.streams[step.stream]}, what);
      }
    } else if (in.op == Op::kReduce) {
      check_finished({r.streams.back()},
                     detail::concat("the reduction of gradient bucket ", in.index + 1, " of ",
                                    r.program.buckets.size()));
    }
  }
};
#endif

void EagerExecutor::run_impl(const BackwardPlan& plan, const std::vector<Tensor>& seeds_in,
                             Device device, RunKind kind, GradientReducer* reducer,
                             std::span<Observer* const> observers) {
  detail::NvtxRange nvtx_backward("backward");
  Run run(*this, plan, device, kind, reducer);
  // Note [Backwards sharing a tape] (engine/tape/autograd.cpp): before any of the nodes is read.
  NodeClaims node_claims(kind == RunKind::kEagerReleasing);
  if (!NodeClaims::held_by_this_thread()) {
    for (const BackwardPlan::Step& s : plan.steps) node_claims.add(*s.node);
  }
  const bool in_capture = kind == RunKind::kInCapture;
  // Note [Leaves shared across threads]: from before the first read of a .grad to after the last
  // write.
  std::optional<LeafClaims> claims;
  if (!in_capture) claims.emplace(plan);
  run.check_inputs();
  // Note [A failed backward]: which leaves had a .grad before, and how far the backward got.
  const bool undoable = !in_capture && !capturing();
  std::vector<std::pair<int, bool>> leaf_had_grad;  // (leaf buffer, .grad defined before)
  if (undoable) {
    for (std::size_t i = 0; i < plan.buffers.size(); ++i) {
      const BackwardPlan::Buffer& b = plan.buffers[i];
      if (b.kind == BackwardPlan::BufferKind::kLeaf)
        leaf_had_grad.emplace_back(static_cast<int>(i), b.leaf.grad().defined());
    }
  }
  int reached = -2;  // -2: nothing written; -1: the seeds; k >= 0: step k began
  run.lower();
  run.open_streams();
  host_us_.clear();  // a timed run's observer fills them
  timed_buckets_.clear();
  for (Observer* o : observers) o->start(run);
  run.take_seeds(seeds_in);
  const int join_begin = run.program.join_begin;
  const int end = static_cast<int>(run.program.instrs.size());
  // Note [A failed backward]: from here on, a failure undoes what can be undone and says the rest.
  // The joined frees are declared before the buffers: their last frees come after the join too.
  std::optional<detail::JoinedFrees> joined_frees;
  try {
    reached = -1;
    run.open_joined_frees(joined_frees);
    run.buffers.assign(plan.buffers.size(), Tensor());
    PlannedSyncScope planned;  // Note [Planned synchronization]: the plan's events order everything
    run.exec_range(0, join_begin, observers, &reached);
    run.buffers.clear();  // inside the joined frees' scope
  } catch (...) {
    run.end_step();
    run.buffers.clear();
    if (!undoable) throw;  // inside a capture: the capture is abandoned with everything in it
    fail_backward(plan, reached, kind == RunKind::kEagerReleasing, leaf_had_grad, [&] {
      try {
        run.exec_range(join_begin, end, {}, nullptr);
        if (joined_frees) joined_frees->joined();
      } catch (const std::exception& e) {
        detail::log_error(__FILE__, __LINE__, e.what());
      }
    });
  }
  run.exec_range(join_begin, end, {}, nullptr);
  if (joined_frees) joined_frees->joined();
}

void EagerExecutor::run(const BackwardPlan& plan, const std::vector<Tensor>& seeds, Device device,
                        std::vector<StepTiming>* timings, bool release_saved, bool localize,
                        GradientReducer* reducer) {
  const bool timed = device.is_cuda() && timings != nullptr;
  if (timed) check_capturable("backward() with timings");  // its trace synchronizes
  localize = localize && device.is_cuda();
  if (localize) check_capturable("backward() with localize_faults");  // it synchronizes
  Timing timing;
  Observer* observers[2] = {};
  std::size_t count = 0;
  if (timed) observers[count++] = &timing;
#if GRAPHWARD_HAS_CUDA
  Localize localizer;
  if (localize) observers[count++] = &localizer;
#endif
  run_impl(plan, seeds, device, release_saved ? RunKind::kEagerReleasing : RunKind::kEager,
           reducer, std::span<Observer* const>(observers, count));
#if GRAPHWARD_HAS_CUDA
  if (timed) {  // read the trace: everything was joined into the caller's stream
    GW_CUDA_CHECK(cudaStreamSynchronize(plan.streams[0]));
    *timings = read_timings(plan, device);
  }
#endif
}

void EagerExecutor::run_timed_in_capture(const BackwardPlan& plan, const std::vector<Tensor>& seeds,
                                         Device device, GradientReducer* reducer) {
  GW_CHECK(device.is_cuda(), "EagerExecutor::run_timed_in_capture: a CUDA plan only");
  Timing timing;
  Observer* observers[1] = {&timing};
  run_impl(plan, seeds, device, RunKind::kInCapture, reducer, observers);
}

}  // namespace graphward
