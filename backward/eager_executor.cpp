#include "backward/backward.h"

#include "runtime/capture_mode.h"
#include "runtime/nvtx.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ops/ops.h"
#include "runtime/blas.h"

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

void EagerExecutor::run(const BackwardPlan& plan, const std::vector<Tensor>& seeds, Device device,
                        std::vector<StepTiming>* timings, bool release_saved, bool localize,
                        GradientReducer* reducer) {
  const bool timed = device.is_cuda() && timings != nullptr;
  if (timed) check_capturable("backward() with timings");  // its trace synchronizes
  localize = localize && device.is_cuda();
  if (localize) check_capturable("backward() with localize_faults");  // it synchronizes
  run_impl(plan, seeds, device, timed, /*in_capture=*/false, release_saved, localize, reducer);
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
  run_impl(plan, seeds, device, /*timed=*/true, /*in_capture=*/true, /*release_saved=*/false,
           /*localize=*/false, reducer);
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

// One run of a plan: what it holds while it runs, and its parts in the order run_impl takes them
// (checks, buckets, streams, seeds, the fork, each step, the join).
struct EagerExecutor::Run {
  using Kind = BackwardPlan::BufferKind;
  Run(EagerExecutor& executor, const BackwardPlan& p, Device d, bool timed_run, bool capture,
      bool release, bool localize_faults, GradientReducer* r)
      : ex(executor),
        plan(p),
        device(d),
        gpu(d.is_cuda()),
        timed(timed_run),
        in_capture(capture),
        release_saved(release),
        localize(localize_faults),
        reducer(r),
        num_steps(static_cast<int>(p.steps.size())),
        fork_event(p.num_events),
        comm_join_event(p.num_events + 1 + static_cast<int>(p.joins.size())) {}

  EagerExecutor& ex;
  const BackwardPlan& plan;
  const Device device;
  const bool gpu;
  bool timed;
  const bool in_capture, release_saved, localize;
  GradientReducer* const reducer;
  const int num_steps;
  const int fork_event;               // the fork's event; the joins' follow it
  const int comm_join_event;          // the reducer's stream joined (and the seeds' bucket waits)
  std::vector<cudaStream_t> streams;  // the plan's, with this executor's own side streams
  cudaStream_t caller = nullptr;
  // Note [Gradient reduction]: the buckets, and an event after each step part a bucket waits for.
  std::vector<GradBucket> buckets;
  std::vector<int> ready_main, ready_side;  // per step; empty without a reducer (no allocation)
  cudaStream_t comm = nullptr;
  std::size_t next_bucket = 0;
  std::vector<Tensor> scaled_seeds;
  const std::vector<Tensor>* seeds = nullptr;
  std::vector<Tensor> buffers;  // the plan's gradient buffers
  std::vector<GradSlot> slots, side_slots;

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

  // Note [Gradient reduction]: the buckets, the layout every process must share (agreed before
  // anything is written), and the events past the fork's and the joins' that buckets wait for.
  void plan_buckets() {
    if (!reducer) return;
    buckets = plan_grad_buckets(plan, reducer->bucket_bytes(), reducer->first_bucket_bytes());
    reducer->agree(bucket_layout_hash(plan, buckets), describe_buckets(plan, buckets), capturing());
    comm = gpu ? reducer->stream() : nullptr;
    GW_CHECK(!gpu || comm, "backward: the gradient reducer has no stream for ", device.str());
    if (!gpu) return;
    ready_main.assign(plan.steps.size(), -1);
    ready_side.assign(plan.steps.size(), -1);
    int next_event = comm_join_event + 1;
    for (const GradBucket& b : buckets) {
      for (const GradBucket::Ready& r : b.ready) {
        if (r.step < 0) continue;
        int& e = r.side ? ready_side[r.step] : ready_main[r.step];
        if (e < 0) e = next_event++;
      }
    }
  }

  void open_streams() {
    streams = plan.streams;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (gpu && !streams[i] && i < plan.side_of.size() && plan.side_of[i] >= 0) {
        streams[i] = ex.side_stream(device, static_cast<int>(i));
      }
    }
    caller = streams[0];
    timed = timed && gpu;
  }

  // Timing events: in a capture, nodes of the graph (recorded by every replay).
  void mark(int i, cudaStream_t s) {
    Event& e = ex.timing_event(device, i);
    in_capture ? e.record_external(s) : e.record(s);
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

  // The seeds that are leaf gradients, the waits of a moved plan, and the fork (rule [fork and
  // join]: every other stream waits on the caller's).
  void begin() {
    for (const BackwardPlan::LeafSeed& ls : plan.leaf_seeds) {
      std::optional<StreamGuard> guard;
      if (gpu) guard.emplace(device, caller, StreamGuard::Recorded{});
      scale_backward((*seeds)[ls.root], 1.0, {&plan.buffers[ls.buffer].leaf.grad(), ls.accumulate});
    }
    // Note [Streams of an eager backward]: a root made on a stream whose steps moved here.
    for (cudaStream_t s : plan.caller_waits) stream_wait_stream(device, caller, s);
    if (gpu && !plan.forks.empty()) {
      Event& e = ex.event(device, fork_event);
      e.record(caller);
      for (int f : plan.forks) e.block(streams[f]);
    }
  }

  // Note [Frees at the join] (runtime/memory.h): memory used on several of the joined streams is
  // cached on the caller's stream after the join, not ordered free by free.
  void open_joined_frees(std::optional<detail::JoinedFrees>& joined_frees) const {
    if (!gpu || in_capture || (plan.joins.empty() && plan.moved_streams.empty())) return;
    std::vector<cudaStream_t> joined;
    for (int j : plan.joins) joined.push_back(streams[j]);
    if (!buckets.empty()) joined.push_back(comm);
    joined_frees.emplace(device, caller, joined, plan.moved_streams);
  }

  // Issues every bucket whose last gradient is written by step `after` (-1: by the seeds).
  void issue_buckets(int after) {
    for (; next_bucket < buckets.size() && buckets[next_bucket].issue_after == after;
         ++next_bucket) {
      issue_bucket(buckets[next_bucket]);
    }
  }

  void issue_bucket(const GradBucket& b) {
    if (gpu) {
      for (const GradBucket::Ready& r : b.ready) {
        if (r.step < 0) {
          Event& e = ex.event(device, comm_join_event);  // the seeds: written on the caller's
          e.record(caller);
          e.block(comm);
        } else {
          ex.event(device, r.side ? ready_side[r.step] : ready_main[r.step]).block(comm);
        }
      }
    }
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
    const int timing = 1 + 4 * num_steps + 2 * static_cast<int>(next_bucket);
    if (timed) mark(timing, comm);
    reducer->reduce(grads);
    if (timed) mark(timing + 1, comm);
#if GRAPHWARD_HAS_CUDA
    if (localize) {
      check_finished({comm}, detail::concat("the reduction of gradient bucket ", next_bucket + 1,
                                            " of ", buckets.size()));
    }
#endif
  }

  // The gradient of the step's node's output: direct writes so far, plus seeds and staged buffers.
  Tensor& gather_grad(const BackwardPlan::Step& step) {
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
    return g;
  }

  // Where the step writes each input's gradient.
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
  }

  // The node's backward into `slots`; with a side stream, the leaf gradients there, from this
  // point of the step's stream (weight-gradient parallelism), and the rest on the step's stream.
  void apply(const BackwardPlan::Step& step, int index, const Tensor& g, cudaStream_t s) {
    // Note [Backward epilogue fusion] (ops/ops.h): the input gradient of this step is the
    // pre-activation gradient of the layer that made its input.
    GradEpilogue epilogue;
    if (step.fuses_activation_of >= 0) {
      const Node& made = *plan.steps[step.fuses_activation_of].node;
      const Node::ActivationFusion& f = *made.activation_fusion();
      epilogue.act = f.act;
      epilogue.act_input = made.saved()[f.act_input_saved].tensor;
      if (f.relu_mask_saved >= 0) epilogue.relu_mask = made.saved()[f.relu_mask_saved].tensor;
      slots[0].epilogue = &epilogue;
    }
    auto run_node = [&](std::span<GradSlot> part) {
      if (step.preactivation_grad) {
        step.node->apply_from_preactivation(g, part);
      } else {
        step.node->apply(g, part);
      }
    };
    if (step.side_stream < 0) {
      run_node(slots);
      return;
    }
    const cudaStream_t side = streams[step.side_stream];
    if (gpu) {
      Event& fork = ex.event(device, step.side_fork_event);
      fork.record(s);
      fork.block(side);
      for (int w : step.side_waits) ex.event(device, plan.waits[w].event).block(side);
    }
    if (timed) mark(1 + 2 * num_steps + 2 * index, side);
    side_slots.assign(slots.size(), GradSlot{});
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const int b = step.writes[i].buffer;
      if (b >= 0 && plan.buffers[b].kind == Kind::kLeaf) std::swap(side_slots[i], slots[i]);
    }
    {
      std::optional<StreamGuard> on_side;
      if (gpu) on_side.emplace(device, side, StreamGuard::Recorded{});
      run_node(side_slots);
    }
    if (timed) mark(2 + 2 * num_steps + 2 * index, side);
    if (gpu && step.side_event >= 0) ex.event(device, step.side_event).record(side);
    if (!ready_side.empty() && ready_side[index] >= 0) {
      ex.event(device, ready_side[index]).record(side);
    }
    run_node(slots);
  }

  void run_step(const BackwardPlan::Step& step, int index) {
    const auto host_start =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const cudaStream_t s = streams[step.stream];
    detail::NvtxRange nvtx_step(step.node->name().c_str());
    std::optional<StreamGuard> guard;
    if (gpu) guard.emplace(device, s, StreamGuard::Recorded{});
    if (gpu) {
      for (int w : step.waits) ex.event(device, plan.waits[w].event).block(s);
    }
    Tensor& g = gather_grad(step);
    if (timed) mark(1 + 2 * index, s);
    fill_slots(step);
    apply(step, index, g, s);
#if GRAPHWARD_HAS_CUDA
    if (localize) {
      const std::string what =
          detail::concat("the backward of ", step.node->label(), " (step ", index + 1, " of ",
                         num_steps, " of the plan, on stream ", step.stream, ")");
      if (step.side_stream >= 0) {
        check_finished({s, streams[step.side_stream]}, what);
      } else {
        check_finished({s}, what);
      }
    }
#endif
    // Nothing reads a node's saved tensors after its step: free them now, as PyTorch does, so
    // that the activations' memory is back in the pool for the rest of the backward (rule [reuse
    // after use] orders each free after the streams that read it; Note [A failed backward] says why
    // not at the end).
    if (release_saved) step.node->release_saved();
    if (timed) mark(2 + 2 * index, s);
    if (gpu && step.event >= 0) ex.event(device, step.event).record(s);
    if (!ready_main.empty() && ready_main[index] >= 0) {
      ex.event(device, ready_main[index]).record(s);
    }
    if (reducer) issue_buckets(index);
    // Last use: rule [reuse after use] keeps the memory until every stream is done with it.
    g = Tensor();
    if (timed) {
      ex.host_us_[index] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_start)
              .count();
    }
  }

  // Rule [fork and join]: the caller's stream waits on every stream the backward used, the
  // reducer's too.
  void join() {
    if (!gpu) return;
    for (std::size_t j = 0; j < plan.joins.size(); ++j) {
      Event& e = ex.event(device, fork_event + 1 + static_cast<int>(j));
      e.record(streams[plan.joins[j]]);
      e.block(caller);
    }
    if (!buckets.empty()) {
      Event& e = ex.event(device, comm_join_event);
      e.record(comm);
      e.block(caller);
    }
  }
};

void EagerExecutor::run_impl(const BackwardPlan& plan, const std::vector<Tensor>& seeds_in,
                             Device device, bool timed, bool in_capture, bool release_saved,
                             bool localize, GradientReducer* reducer) {
  detail::NvtxRange nvtx_backward("backward");
  Run run(*this, plan, device, timed, in_capture, release_saved, localize, reducer);
  run.check_inputs();
  // Note [Leaves shared across threads]: from before the first write to after the last.
  std::optional<LeafClaims> claims;
  if (!in_capture) claims.emplace(plan);
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
  run.plan_buckets();
  run.open_streams();
  if (run.timed) run.mark(0, run.caller);  // the origin of the trace
#if GRAPHWARD_HAS_CUDA
  if (localize)
    check_finished({run.caller}, "work enqueued before the backward (not the backward)");
#else
  (void)localize;  // no kernel faults to localize on the CPU
#endif
  run.take_seeds(seeds_in);
  // Note [A failed backward]: from here on, a failure undoes what can be undone and says the rest.
  // The joined frees are declared before the buffers: their last frees come after the join too.
  std::optional<detail::JoinedFrees> joined_frees;
  try {
    reached = -1;
    run.begin();
    run.open_joined_frees(joined_frees);
    run.buffers.assign(plan.buffers.size(), Tensor());
    host_us_.clear();
    timed_buckets_.clear();
    if (run.timed) {
      for (const GradBucket& b : run.buckets) timed_buckets_.push_back({b.buffers.size(), b.bytes});
      host_us_.assign(plan.steps.size(), 0.0);
    }
    PlannedSyncScope planned;  // Note [Planned synchronization]: the plan's events order everything
    if (reducer) run.issue_buckets(-1);  // gradients only a seed writes
    for (int k = 0; k < run.num_steps; ++k) {
      reached = k;
      run.run_step(plan.steps[static_cast<std::size_t>(k)], k);
    }
    run.buffers.clear();  // inside the joined frees' scope
  } catch (...) {
    run.buffers.clear();
    if (!undoable) throw;  // inside a capture: the capture is abandoned with everything in it
    fail_backward(plan, reached, release_saved, leaf_had_grad, [&] {
      try {
        run.join();
        if (joined_frees) joined_frees->joined();
      } catch (const std::exception& e) {
        detail::log_error(__FILE__, __LINE__, e.what());
      }
    });
  }
  run.join();
  if (joined_frees) joined_frees->joined();
}

}  // namespace graphward
