#include "engine/backward.h"

#include "engine/capture_mode.h"
#include "engine/nvtx.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/ops.h"

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
// orders the host's enqueues; the work itself is ordered by the streams' contract (rule 4: the
// first backward's gradients are complete on its caller's stream, which the second caller's
// stream must follow for .grad, Note [Planned synchronization]).
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

// Note [A failed backward]
// A backward that fails part-way — out of memory for a gradient buffer, a kernel that cannot be
// launched, a reducer's error — must leave nothing it does not say. Leaves whose .grad this
// backward created get their undefined .grad back. A .grad that was defined before and that a
// step already wrote cannot be restored without a copy of it made every backward (memory and a
// kernel a leaf, on the path every step takes), so the error names those leaves: overwrite them
// (zero_grad, or GradWrite::kOverwrite) before a retry. The saved tensors of the steps that
// finished were freed as the backward went (as PyTorch frees them): the error says how many, and
// a later backward through those nodes is refused naming the failed backward ("run the forward
// again"); when none was freed (a failure at the first step, or retain_graph) the tape is whole
// and the backward may simply run again. The streams the backward forked are joined into the
// caller's (rule 4) before the error is thrown, and the error keeps its type (OutOfMemoryError,
// CudaError, Error; std::bad_alloc becomes OutOfMemoryError) with this account added. Inside a
// capture none of this applies: the error goes up as it was, and the capture is abandoned with
// whatever it recorded (capture_stream).
//
// Freeing the saved tensors at the end instead, so that every failure left the tape whole, was
// measured and not chosen: it raises the backward's peak memory on every step (docs/DECISIONS.md,
// "a failed backward says what it left"), for a retry that out of memory rarely allows anyway.
void EagerExecutor::fail_backward(const BackwardPlan& plan, int reached, bool release_saved,
                                  const std::vector<std::pair<int, bool>>& leaf_had_grad,
                                  const std::function<void()>& join) {
  join();
  // Steps before `reached` finished, and freed their saved tensors when asked to.
  std::size_t freed = 0;
  for (int k = 0; k < reached; ++k) {
    Node* n = plan.steps[static_cast<std::size_t>(k)].node;
    if (release_saved && n->released()) {
      n->note_released_by_failed_backward();
      ++freed;
    }
  }
  std::vector<std::string> partial;
  std::size_t reset = 0;
  for (const auto& [i, had] : leaf_had_grad) {
    const BackwardPlan::Buffer& b = plan.buffers[static_cast<std::size_t>(i)];
    if (!had) {
      if (b.leaf.grad().defined()) ++reset;
      b.leaf.grad() = Tensor();
      continue;
    }
    bool written = false;
    for (int c : b.contributors)
      written = written || (c == BackwardPlan::kSeed ? reached >= -1 : c <= reached);
    if (written) partial.push_back(b.leaf.str());
  }
  std::string account = detail::concat(
      " [the backward failed ",
      reached == -2 ? std::string("before it wrote anything")
      : reached == -1
          ? std::string("at its seeds")
          : detail::concat("at step ", reached + 1, " of ", plan.steps.size(), " (",
                           plan.steps[static_cast<std::size_t>(reached)].node->label(), ")"),
      ". ",
      freed == 0
          ? std::string(
                "Nothing was released: the tape is whole and the backward may be run again. ")
          : detail::concat("The saved tensors of the ", freed, " step", freed == 1 ? "" : "s",
                           " before it were freed as it went: run the forward again before another "
                           "backward. "));
  account += reset ? detail::concat(reset, " .grad",
                                    reset == 1 ? " it had made was" : "s it had made were",
                                    " undefined again. ")
                   : std::string();
  if (partial.empty()) {
    account += "No .grad that existed before was written.]";
  } else {
    account +=
        detail::concat(partial.size(), " .grad", partial.size() == 1 ? "" : "s",
                       " that existed before already hold part of this backward's gradient: ");
    for (std::size_t k = 0; k < partial.size() && k < 8; ++k)
      account += (k ? ", " : "") + partial[k];
    if (partial.size() > 8) account += ", ...";
    account += "; overwrite them (zero_grad, or GradWrite::kOverwrite) before running it again.]";
  }
  try {
    throw;
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.what() + account);
  } catch (const CudaError& e) {
    throw CudaError(e.what() + account, e.code());
  } catch (const Error& e) {
    throw Error(e.what() + account);
  } catch (const std::bad_alloc& e) {
    throw OutOfMemoryError(std::string("graphward: out of host memory (") + e.what() + ")" +
                           account);
  }
}

void EagerExecutor::run_impl(const BackwardPlan& plan, const std::vector<Tensor>& seeds_in,
                             Device device, bool timed, bool in_capture, bool release_saved,
                             bool localize, GradientReducer* reducer) {
  using Kind = BackwardPlan::BufferKind;
  detail::NvtxRange nvtx_backward("backward");
  // Note [Check, then write]: refuse before launching anything.
  for (const BackwardPlan::Step& s : plan.steps) s.node->check_saved();
  for (const BackwardPlan::Buffer& b : plan.buffers) {
    if (b.kind != Kind::kLeaf || !b.leaf.grad().defined()) continue;
    const Tensor& g = b.leaf.grad();
    GW_CHECK(
        g.shape() == b.leaf.shape() && g.dtype() == b.leaf.dtype() && g.device() == b.leaf.device(),
        "backward: the .grad of leaf ", b.leaf.str(), " is ", g.str(),
        "; expected the leaf's shape, dtype and device");
  }
  const bool gpu = device.is_cuda();
  // Note [Leaves shared across threads]: from before the first write to after the last.
  std::optional<LeafClaims> claims;
  if (!in_capture) claims.emplace(plan);
  // Note [A failed backward]: which leaves had a .grad before, and how far the backward got.
  const bool undoable = !in_capture && !capturing();
  std::vector<std::pair<int, bool>> leaf_had_grad;  // (leaf buffer, .grad defined before)
  if (undoable) {
    for (std::size_t i = 0; i < plan.buffers.size(); ++i) {
      const BackwardPlan::Buffer& b = plan.buffers[i];
      if (b.kind == Kind::kLeaf)
        leaf_had_grad.emplace_back(static_cast<int>(i), b.leaf.grad().defined());
    }
  }
  int reached = -2;  // -2: nothing written; -1: the seeds; k >= 0: step k began
  // Note [Gradient reduction]: the buckets, the layout every process must share (agreed before
  // anything is written), and an event after each step part a bucket waits for (events past the
  // fork's and the joins').
  std::vector<GradBucket> buckets;
  std::vector<int> ready_main, ready_side;  // per step; empty without a reducer (no allocation)
  const int comm_join_event = plan.num_events + 1 + static_cast<int>(plan.joins.size());
  cudaStream_t comm = nullptr;
  std::size_t next_bucket = 0;
  if (reducer) {
    buckets = plan_grad_buckets(plan, reducer->bucket_bytes(), reducer->first_bucket_bytes());
    reducer->agree(bucket_layout_hash(plan, buckets), describe_buckets(plan, buckets), capturing());
    comm = gpu ? reducer->stream() : nullptr;
    GW_CHECK(!gpu || comm, "backward: the gradient reducer has no stream for ", device.str());
    if (gpu) {
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
  }
  // The plan's streams, with this executor's own streams for the side streams it leaves open.
  std::vector<cudaStream_t> streams = plan.streams;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    if (gpu && !streams[i] && i < plan.side_of.size() && plan.side_of[i] >= 0) {
      streams[i] = side_stream(device, static_cast<int>(i));
    }
  }
  const cudaStream_t caller = streams[0];
  timed = timed && gpu;
  // Timing events: in a capture, nodes of the graph (recorded by every replay).
  auto mark = [&](int i, cudaStream_t s) {
    Event& e = timing_event(device, i);
    in_capture ? e.record_external(s) : e.record(s);
  };
  const int num_steps = static_cast<int>(plan.steps.size());
  if (timed) mark(0, caller);  // the origin of the trace
#if GRAPHWARD_HAS_CUDA
  if (localize) check_finished({caller}, "work enqueued before the backward (not the backward)");
#else
  (void)localize;  // no kernel faults to localize on the CPU
#endif

  if (gpu) {  // seeds made elsewhere must be ready on the caller's stream (rule 6)
    for (const Tensor& s : seeds_in) s.storage()->sync_for_read(caller);
  }
  // Note [Summed reductions] (dist/process_group.h): a reducer that sums its buckets gets every
  // gradient already divided by the world size, through the seeds (the backward is linear in
  // them); scaled on the caller's stream, captured with the rest.
  std::vector<Tensor> scaled_seeds;
  const double seed_scale = reducer ? reducer->begin_backward(plan.grad_write) : 1.0;
  if (seed_scale != 1.0) {
    NoGradGuard no_grad;
    std::optional<StreamGuard> guard;
    if (gpu) guard.emplace(device, caller, StreamGuard::Recorded{});
    for (const Tensor& s : seeds_in) scaled_seeds.push_back(mul(s, seed_scale));
  }
  const std::vector<Tensor>& seeds = scaled_seeds.empty() ? seeds_in : scaled_seeds;
  // Note [A failed backward]: from here on, a failure undoes what can be undone and says the rest.
  const int fork_event = plan.num_events;
  // Join (rule 4): the caller's stream waits on every stream the backward used, the reducer's
  // too.
  auto join = [&] {
    if (!gpu) return;
    for (std::size_t j = 0; j < plan.joins.size(); ++j) {
      Event& e = event(device, fork_event + 1 + static_cast<int>(j));
      e.record(streams[plan.joins[j]]);
      e.block(caller);
    }
    if (!buckets.empty()) {
      Event& e = event(device, comm_join_event);
      e.record(comm);
      e.block(caller);
    }
  };
  std::optional<detail::JoinedFrees> joined_frees;
  try {
    reached = -1;
    for (const BackwardPlan::LeafSeed& ls : plan.leaf_seeds) {
      std::optional<StreamGuard> guard;
      if (gpu) guard.emplace(device, caller, StreamGuard::Recorded{});
      scale_backward(seeds[ls.root], 1.0, {&plan.buffers[ls.buffer].leaf.grad(), ls.accumulate});
    }
    // Note [Streams of an eager backward]: a root made on a stream whose steps moved here.
    for (cudaStream_t s : plan.caller_waits) stream_wait_stream(device, caller, s);
    // Fork (rule 4): every other stream waits on the caller's stream.
    if (gpu && !plan.forks.empty()) {
      Event& e = event(device, fork_event);
      e.record(caller);
      for (int f : plan.forks) e.block(streams[f]);
    }

    // Issues every bucket whose last gradient is written by step `after` (-1: by the seeds).
    auto issue_buckets = [&](int after) {
      for (; next_bucket < buckets.size() && buckets[next_bucket].issue_after == after;
           ++next_bucket) {
        const GradBucket& b = buckets[next_bucket];
        std::vector<Tensor> grads;
        grads.reserve(b.buffers.size());
        if (gpu) {
          for (const GradBucket::Ready& r : b.ready) {
            if (r.step < 0) {
              Event& e = event(device, comm_join_event);  // the seeds: written on the caller's
              e.record(caller);
              e.block(comm);
            } else {
              event(device, r.side ? ready_side[r.step] : ready_main[r.step]).block(comm);
            }
          }
        }
        for (int i : b.buffers) {
          const Tensor& g = plan.buffers[i].leaf.grad();
          GW_CHECK(g.defined(), "backward: the gradient of leaf ", plan.buffers[i].leaf.str(),
                   " was not written (an internal error of the plan)");
          if (gpu) g.storage()->sync_for_write(comm);  // planned: records the use (rule 7)
        }
        if (!in_capture && !capturing()) {  // Note [Gradients in buckets]: eager only
          std::vector<Tensor*> slots;
          slots.reserve(b.buffers.size());
          for (int i : b.buffers) slots.push_back(&plan.buffers[i].leaf.grad());
          reducer->place(slots);
        }
        for (int i : b.buffers) grads.push_back(plan.buffers[i].leaf.grad());
        detail::NvtxRange nvtx_reduce("reduce gradients");
        const int timing = 1 + 4 * num_steps + 2 * static_cast<int>(next_bucket);
        if (timed) mark(timing, comm);
        reducer->reduce(grads);
        if (timed) mark(timing + 1, comm);
#if GRAPHWARD_HAS_CUDA
        if (localize) {
          check_finished({comm}, detail::concat("the reduction of gradient bucket ",
                                                next_bucket + 1, " of ", buckets.size()));
        }
#endif
      }
    };

    // Note [Frees at the join] (engine/memory.h): memory used on several of the joined streams is
    // cached on the caller's stream after the join, not ordered free by free. Declared before the
    // buffers (outside this block): their last frees come after the join too.
    if (gpu && !in_capture && (!plan.joins.empty() || !plan.moved_streams.empty())) {
      std::vector<cudaStream_t> joined;
      for (int j : plan.joins) joined.push_back(streams[j]);
      if (!buckets.empty()) joined.push_back(comm);
      joined_frees.emplace(device, caller, joined, plan.moved_streams);
    }
    std::vector<Tensor> buffers(plan.buffers.size());
    std::vector<double>& host_us = host_us_;  // per step, when timed
    host_us.clear();
    timed_buckets_.clear();
    if (timed) {
      for (const GradBucket& b : buckets) timed_buckets_.push_back({b.buffers.size(), b.bytes});
    }
    {
      PlannedSyncScope
          planned;  // Note [Planned synchronization]: the plan's events order everything
      std::vector<GradSlot> slots, side_slots;
      if (timed) host_us.assign(plan.steps.size(), 0.0);
      if (reducer) issue_buckets(-1);  // gradients only a seed writes
      for (const BackwardPlan::Step& step : plan.steps) {
        const auto host_start =
            timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        reached = static_cast<int>(&step - plan.steps.data());
        const cudaStream_t s = streams[step.stream];
        detail::NvtxRange nvtx_step(step.node->name().c_str());
        std::optional<StreamGuard> guard;
        if (gpu) guard.emplace(device, s, StreamGuard::Recorded{});
        if (gpu) {
          for (int w : step.waits) event(device, plan.waits[w].event).block(s);
        }
        // The gradient of the node's output: direct writes so far, plus seeds and staged buffers.
        Tensor& g = buffers[step.grad_buffer];
        const std::size_t pending = step.seeds.size() + step.staged.size();
        std::size_t added = 0;
        auto add_in = [&](const Tensor& part, bool owned) {
          if (!g.defined() && (owned || pending == 1)) {
            g = part;  // take it (a lone seed is only read)
          } else {
            scale_backward(part, 1.0, {&g, g.defined()});  // copy or add, on this stream
          }
          ++added;
        };
        for (int r : step.seeds) add_in(seeds[r], false);
        for (int b : step.staged) {
          add_in(buffers[b], true);
          buffers[b] = Tensor();
        }
        GW_CHECK(g.defined(), "backward: no gradient reached ", step.node->label(),
                 " (an internal error of the plan)");
        const int step_index = static_cast<int>(&step - plan.steps.data());
        if (timed) mark(1 + 2 * step_index, s);
        slots.assign(step.writes.size(), GradSlot{});
        for (std::size_t i = 0; i < step.writes.size(); ++i) {
          const BackwardPlan::Write& w = step.writes[i];
          if (w.buffer < 0) continue;
          const BackwardPlan::Buffer& b = plan.buffers[w.buffer];
          // A gradient buffer written by this step alone is only read after it: an op may store a
          // gradient equal to its grad_out there without a copy (GradSlot::may_share). Never a
          // leaf's .grad (persistent, accumulated by later backwards) or a staged buffer (added
          // into its target in place).
          const bool share = b.kind == Kind::kGrad && b.contributors.size() == 1 && !w.accumulate;
          slots[i] = {b.kind == Kind::kLeaf ? &b.leaf.grad() : &buffers[w.buffer], w.accumulate,
                      share};
        }
        // Note [Backward epilogue fusion] (engine/ops.h): the input gradient of this step is the
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
        auto apply = [&](std::span<GradSlot> part) {
          if (step.preactivation_grad) {
            step.node->apply_from_preactivation(g, part);
          } else {
            step.node->apply(g, part);
          }
        };
        if (step.side_stream < 0) {
          apply(slots);
        } else {
          // Weight-gradient parallelism: the leaf gradients on the side stream, from this point of
          // the step's stream (the gradient is assembled), the rest on the step's stream.
          const cudaStream_t side = streams[step.side_stream];
          if (gpu) {
            Event& fork = event(device, step.side_fork_event);
            fork.record(s);
            fork.block(side);
            for (int w : step.side_waits) event(device, plan.waits[w].event).block(side);
          }
          if (timed) mark(1 + 2 * num_steps + 2 * step_index, side);
          side_slots.assign(slots.size(), GradSlot{});
          for (std::size_t i = 0; i < slots.size(); ++i) {
            const int b = step.writes[i].buffer;
            if (b >= 0 && plan.buffers[b].kind == Kind::kLeaf) std::swap(side_slots[i], slots[i]);
          }
          {
            std::optional<StreamGuard> on_side;
            if (gpu) on_side.emplace(device, side, StreamGuard::Recorded{});
            apply(side_slots);
          }
          if (timed) mark(2 + 2 * num_steps + 2 * step_index, side);
          if (gpu && step.side_event >= 0) event(device, step.side_event).record(side);
          if (!ready_side.empty() && ready_side[step_index] >= 0) {
            event(device, ready_side[step_index]).record(side);
          }
          apply(slots);
        }
#if GRAPHWARD_HAS_CUDA
        if (localize) {
          const std::string what =
              detail::concat("the backward of ", step.node->label(), " (step ", step_index + 1,
                             " of ", num_steps, " of the plan, on stream ", step.stream, ")");
          if (step.side_stream >= 0) {
            check_finished({s, streams[step.side_stream]}, what);
          } else {
            check_finished({s}, what);
          }
        }
#endif
        // Nothing reads a node's saved tensors after its step: free them now, as PyTorch does, so
        // that the activations' memory is back in the pool for the rest of the backward (rule 7
        // orders each free after the streams that read it; Note [A failed backward] says why not
        // at the end).
        if (release_saved) step.node->release_saved();
        if (timed) mark(2 + 2 * step_index, s);
        if (gpu && step.event >= 0) event(device, step.event).record(s);
        if (!ready_main.empty() && ready_main[step_index] >= 0) {
          event(device, ready_main[step_index]).record(s);
        }
        if (reducer) issue_buckets(step_index);
        g = Tensor();  // last use (rule 7 keeps the memory until every stream is done with it)
        if (timed) {
          host_us[step_index] = std::chrono::duration<double, std::micro>(
                                    std::chrono::steady_clock::now() - host_start)
                                    .count();
        }
      }
    }
  } catch (...) {
    if (!undoable) throw;  // inside a capture: the capture is abandoned with everything in it
    fail_backward(plan, reached, release_saved, leaf_had_grad, [&] {
      try {
        join();
        if (joined_frees) joined_frees->joined();
      } catch (const std::exception& e) {
        detail::log_error(__FILE__, __LINE__, e.what());
      }
    });
  }
  join();
  if (joined_frees) joined_frees->joined();
}

}  // namespace graphward
