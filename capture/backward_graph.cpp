#include "graphward/capture/backward_graph.h"
#include "graphward/capture/backward_graph_detail.h"

#include "graphward/capture/graph_topology.h"
#include "graphward/capture/stream_capture.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/graph_pool.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/runtime/step_arena.h"
#include "graphward/engine/tape/tape_log.h"

#if GRAPHWARD_HAS_CUDA
#include "graphward/engine/runtime/blas.h"
#endif

namespace graphward {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

#if GRAPHWARD_HAS_CUDA
namespace {
// "the backward graph captured at backward() call 3 (24 kernel nodes; the plan's nodes:
// mse_loss#41, linear#40, ...)": what a kernel fault after its launch names.
std::string describe(const BackwardPlan& plan, std::uint64_t call, const GraphStats& stats) {
  std::string out =
      detail::concat("the backward graph captured at BackwardGraph::backward() call ", call, " (",
                     stats.kernel_nodes, " kernel nodes; the plan's nodes: ");
  constexpr std::size_t kShown = 12;
  for (std::size_t i = 0; i < plan.steps.size() && i < kShown; ++i) {
    out += (i ? ", " : "") + plan.steps[i].node->label();
  }
  if (plan.steps.size() > kShown)
    out += detail::concat(", and ", plan.steps.size() - kShown, " more");
  return out + ")";
}
}  // namespace
#endif

BackwardGraph::BackwardGraph(Device device, BackwardGraphOptions options)
    : device_(device),
      options_(options),
      localize_(options.backward.localize_faults || localize_faults_from_env()),
      split_(options.backward.split_weight_grads.value_or(true)),
      cache_(options.cache_capacity) {
  if (device.is_cuda()) check_cuda_device(device, "BackwardGraph");
  GW_CHECK(!options.backward.retain_graph,
           "BackwardGraph: options.backward.retain_graph is set; "
           "a replayed backward releases its step's saved tensors: run the forward again for "
           "each backward (or use graphward::backward for a retained graph)");
  GW_CHECK(options.backward.timings == nullptr,
           "BackwardGraph: options.backward.timings is set; "
           "time a replay with BackwardGraph::trace() (or an eager backward with "
           "graphward::backward)");
  GW_CHECK(options.warmup >= 1 || device.is_cpu() || options.force_eager,
           "BackwardGraph: warmup is ", options.warmup,
           "; expected at least 1 eager backward before the first capture (cuBLAS and the GEMM "
           "plans must be initialized outside a capture)");
  // Last: a constructor that throws runs no destructor, and a log armed by it would stay armed
  // (holding the thread's last step's leaves) for the life of the thread.
  if (device.is_cuda() && !options.force_eager && !localize_) {
    detail::tape_log_arm();  // Note [Tape log]
    armed_on_ = std::this_thread::get_id();
  }
}

BackwardGraph::~BackwardGraph() {
  // Another thread's log cannot be reached from here; it stays armed, within its cap.
  if (armed_on_ == std::this_thread::get_id()) detail::tape_log_disarm();
}

void BackwardGraph::eager(const Tensor& loss, GradWrite grad_write) {
  BackwardOptions o = options_.backward;
  o.grad_write = grad_write;
  o.split_weight_grads = split_;
  o.localize_faults = localize_;
  o.check_finite_loss = false;  // backward() checked it
  graphward::backward(loss, o);
  ++eager_;
}

#if GRAPHWARD_HAS_CUDA
namespace {

GraphStats stats_of(cudaGraph_t graph, const BackwardPlan& plan) {
  GraphStats st;
  const capture::NodeCounts counts = capture::count_nodes(graph);
  const std::vector<cudaGraphNode_t>& nodes = counts.nodes;
  st.kernel_nodes = counts.kernels;
  st.other_nodes = counts.others;
  st.memory_nodes = counts.memory;
  // The graph's own shape (not the plan's): numbered nodes, edges between them.
  st.topology = capture::topology_of(graph, nodes, &st.edges);
  st.streams = plan.streams.size();
  st.forks = plan.forks.size();
  st.joins = plan.joins.size();
  return st;
}

}  // namespace
#endif

void BackwardGraph::check_loss(const Tensor& loss, const char* what) const {
  GW_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(), what,
           ": expected a one-element loss that requires grad, got ", loss.str());
  GW_CHECK(loss.device() == device_, what, ": the loss is on ", loss.device().str(),
           "; this BackwardGraph is for ", device_.str());
}

#if GRAPHWARD_HAS_CUDA
void BackwardGraph::ensure_seed(const Tensor& loss, cudaStream_t caller) {
  // The seed: static, made on the caller's stream (so nothing waits on another stream in the
  // capture), remade only when the loss's shape or the caller's stream changes; never in a step's
  // arena (made in the first captured step alone, it would move the next micro-batch's forward in
  // the next step, and that program's graph would be updated once).
  if (!seed_.defined() || seed_.shape() != loss.shape() || seed_.dtype() != loss.dtype() ||
      seed_.storage()->producer_stream() != caller) {
    const detail::OutsideStepArena outside;
    seed_ = ones(loss.shape(), {loss.dtype(), device_});
  }
}

void BackwardGraph::use_capture_streams(BackwardPlan& plan) {
  while (capture_streams_.size() + 1 < plan.streams.size()) {
    capture_streams_.push_back(std::make_unique<Stream>(device_));
  }
  for (std::size_t i = 1; i < plan.streams.size(); ++i) {
    plan.streams[i] = capture_streams_[i - 1]->get();
    (void)blas_context(device_, plan.streams[i]);  // handle and workspace: outside the capture
  }
}

cudaGraph_t BackwardGraph::capture_plan(const BackwardPlan& plan, cudaStream_t caller,
                                        GraphMemoryPool& pool, bool timed,
                                        std::vector<std::shared_ptr<ReplayWatcher>>* watchers) {
  detail::NvtxRange nvtx("BackwardGraph::capture");
  return capture::capture_stream(
      caller, "BackwardGraph", "some work in the backward was not capturable or used a stream "
      "outside the capture", [&] {
        CaptureModeScope scope("the backward graph");
        GraphPoolScope pool_scope(pool);
        if (timed) {
          executor_.run_timed_in_capture(plan, {seed_}, device_,
                                         options_.backward.reduce_gradients);
        } else {
          executor_.run(plan, {seed_}, device_, nullptr, /*release_saved=*/false,
                        /*localize=*/false, options_.backward.reduce_gradients);
        }
      },
      watchers);
}

void BackwardGraph::order_before_launch(const Tensor& loss, cudaStream_t caller,
                                        const std::vector<Tensor>& leaves, bool scan_grads) {
  // Before the launch (and before any capture, which records the plan's uses of the storage as if
  // it ran), the caller's stream waits where rule [read after write] needs it. What the graph reads
  // was made by the forward, upstream of the loss: every cross-stream edge of it was ordered when
  // the forward consumed it, so the stream that produced the loss is ordered after all of it — the
  // caller waits on that stream if it is another. What the graph writes (the .grads) it orders
  // after their last writer and every stream that read them since (an optimizer on a stream of its
  // own). The events are the BackwardGraph's own, recorded again every step; in the usual step
  // (loss and optimizer on the caller's stream) there is no wait at all.
  std::size_t waits = 0;
  extra_waited_.clear();
  auto wait_for = [&](cudaStream_t s) {
    if (!s || s == caller ||
        std::find(extra_waited_.begin(), extra_waited_.end(), s) != extra_waited_.end()) {
      return;
    }
    extra_waited_.push_back(s);
    if (waits == wait_events_.size()) wait_events_.emplace_back(device_);
    Event& ev = wait_events_[waits++];
    ev.record(s);
    ev.block(caller);
  };
  wait_for(loss.storage()->producer_stream());
  // Graphs launched on one stream run in order; after a launch on another stream, wait for it
  // (graphs of one structure share their memory pool).
  wait_for(last_launch_stream_);
  if (!scan_grads) return;
  for (const Tensor& leaf : leaves) {
    const Tensor& g = leaf.grad();
    if (g.defined()) g.storage()->for_each_write_hazard(wait_for);
  }
}
#endif

bool BackwardGraph::make_missing_grads(const std::vector<Tensor>& leaves) {
  // A graph writes gradients into persistent buffers: every leaf it reaches gets one before it is
  // captured, never in a step's arena (made in this step alone, it would move what follows).
  const detail::OutsideStepArena outside;
  bool made = false;
  for (const Tensor& leaf : leaves) {
    if (!leaf.grad().defined()) {
      leaf.grad() = zeros(leaf.shape(), {leaf.dtype(), device_});
      made = true;
    }
  }
  return made;
}

void BackwardGraph::check_thread(const char* what) const {
  const std::thread::id me = std::this_thread::get_id();
  if (me == owner_) return;
  std::ostringstream os;
  os << what << " on thread " << me << "; this BackwardGraph serves thread " << owner_
     << ", which made it (its tape log, the library handles its captures use and its graphs' "
        "inputs are that thread's). Expected a BackwardGraph on each thread (they may share "
        "parameters: their backwards take turns on a shared .grad)";
  GW_CHECK(false, os.str());
}

void BackwardGraph::backward(const Tensor& loss, GradWrite grad_write) {
  check_thread("BackwardGraph::backward");
  std::lock_guard<std::mutex> lock(mutex_);
  backward_locked(loss, grad_write);
}

void BackwardGraph::backward_locked(const Tensor& loss, GradWrite grad_write) {
  check_loss(loss, "BackwardGraph::backward");
  GW_CHECK(is_valid(grad_write), "BackwardGraph::backward: grad_write is GradWrite(",
           static_cast<int>(grad_write), "); expected GradWrite::kAccumulate or kOverwrite");
  // A BackwardGraph captures graphs of its own, which cannot nest in another capture (the CUDA
  // runtime refused it with a bare cudaErrorStreamCaptureIsolation).
  GW_CHECK(!capturing(), "BackwardGraph::backward inside a capture (",
           capture_name() ? *capture_name() : std::string("unnamed"),
           "); a BackwardGraph captures and replays graphs of its own: inside a StepGraph's step "
           "call graphward::backward(loss), which the step's graph captures");
  // Whatever happens, the next step's tape is logged from here (Note [Tape log]).
  struct ResetLog {
    ~ResetLog() { detail::tape_log_reset(); }
  } reset_log;
  if (options_.backward.check_finite_loss) check_finite_roots("BackwardGraph::backward", {loss});
  ++calls_;
  const std::size_t program = static_cast<std::size_t>(grad_write);
  ++program_calls_[program];
  if (device_.is_cpu() || options_.force_eager || localize_ ||
      program_calls_[program] <= static_cast<std::uint64_t>(options_.warmup)) {
#if GRAPHWARD_HAS_CUDA
    // Note [Input slots]: what the program's warm-up's tape read, for its first capture to
    // compare with.
    if (device_.is_cuda() && !options_.force_eager && !localize_) {
      capture::TapeSignature& warm = warm_[program];
      roots_.assign(1, loss);
      capture::tape_signature_walk(warm, roots_, {}, current_stream(device_), grad_write);
      warm.nodes.clear();
      warm.leaves.clear();
      roots_.clear();
    }
#endif
    eager(loss, grad_write);
    return;
  }
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device_);
  const auto t0 = Clock::now();
  const cudaStream_t caller = current_stream(device_);
  ensure_seed(loss, caller);
  capture::TapeSignature& sig = signature_;
  roots_.assign(1, loss);
  seeds_.assign(1, seed_);
  {
    detail::NvtxRange nvtx("BackwardGraph::signature");
    capture::tape_signature(sig, roots_, seeds_, caller, grad_write);
  }
  // Note [Writes of a replayed graph]: once the memo's .grads changed, the .grads that follow
  // grad_writes_ may not be this step's (even when a later step finds them unchanged again).
  if (!sig.grads_unchanged) grad_writes_leaves_.clear();
  last_from_log_ = sig.source == capture::TapeSignature::Source::kLog;
  if (last_from_log_) ++log_signatures_;
  const auto t_signed = Clock::now();

  // Rule [read after write] before the launch and before any capture (order_before_launch).
  // The scan of the .grads is skipped when it cannot find anything new: the same .grad tensors
  // as at the last scan (Storage::watch()ed after each replay), and no new hazard on any watched
  // storage since (detail::watched_hazard_epoch). The epoch is read before the scan: a hazard
  // that appears during or after it bumps it again.
  const std::uint64_t hazards = detail::watched_hazard_epoch();
  const bool scan_grads = !(sig.grads_unchanged && hazards == hazards_seen_);
  order_before_launch(loss, caller, sig.leaves, scan_grads);  // a log's list may hold more: harmless
  hazards_seen_ = hazards;
  const auto t_waited = Clock::now();

  Cache::Decision decision = decide(caller, grad_write);
  const bool replay = decision.action == Cache::Action::kReplay;
  // Note [Backwards sharing a tape] (engine/tape/autograd.cpp): the replay frees the step's saved
  // tensors; a capture on the way runs under these claims.
  NodeClaims claims(/*exclusive=*/true);
  claim_reached(claims, decision);
  const NodeClaims::ThreadScope claims_held;
  const std::shared_ptr<Executable> exec =
      replay ? decision.entry->exec : capture_or_update(decision, loss, caller, grad_write);
  const auto t_decided = Clock::now();
  // A capture or update filled the slots already.
  if (replay) refresh_slots(*exec, caller);
  const auto t_refreshed = Clock::now();
  {
    detail::NvtxRange nvtx("BackwardGraph::replay");
    exec->graph.launch(caller);
  }
  detail::note_graph_launch(exec->description);  // Note [Kernel faults]
  last_launch_stream_ = caller;
  const auto t_launched = Clock::now();
  detail::tape_log_expect(exec->nodes_part);  // what the next step's forward is compared with
  cache_.count_replay();
  last_stats_ = exec->stats;
  const bool whole_step = record_and_release(*exec, caller);
  sig.nodes.clear();  // the step's handles: let the tape go
  sig.leaves.clear();
  walk_.nodes.clear();
  walk_.leaves.clear();
  roots_.clear();
  const auto t_end = Clock::now();
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  host_ = {us(t0, t_signed),
           us(t_signed, t_waited),
           us(t_waited, t_decided),
           us(t_decided, t_refreshed),
           us(t_refreshed, t_launched),
           us(t_launched, t_end),
           whole_step};
#else
  eager(loss, grad_write);
#endif
}

#if GRAPHWARD_HAS_CUDA
BackwardGraph::Cache::Decision BackwardGraph::decide(cudaStream_t caller, GradWrite grad_write) {
  capture::TapeSignature& sig = signature_;
  // The forward compared its tape with the last replayed one as it recorded it: when all of it
  // matched, only the rest is compared now.
  auto* recent = cache_.most_recent();
  const bool nodes_known = sig.nodes_equal_to && recent &&
                           recent->exec->nodes_part.get() == sig.nodes_equal_to;
  last_matched_in_forward_ = nodes_known;
  Cache::Decision decision =
      nodes_known ? cache_.decide_nodes_known(*recent, sig) : cache_.decide(sig);
  if (decision.action != Cache::Action::kReplay) {
    // The nodes and leaves the backward reaches (the log may hold more). A graph writes gradients
    // into persistent buffers: every leaf it reaches gets one before it is captured.
    capture::tape_signature_walk(walk_, roots_, seeds_, caller, grad_write);
    if (make_missing_grads(walk_.leaves)) {
      capture::refresh_leaves(sig, roots_, seeds_, caller, grad_write);
      decision = cache_.decide(sig);
    }
  }
  return decision;
}

void BackwardGraph::claim_reached(NodeClaims& claims, const Cache::Decision& decision) {
  const capture::TapeSignature& sig = signature_;
  if (decision.action != Cache::Action::kReplay) {
    for (const Node* n : walk_.nodes) claims.add(*n);  // what decide() walked: the reached nodes
    return;
  }
  const Executable& e = *decision.entry->exec;
  // The whole step the tape log recorded, every node of it reached (as record_and_release
  // releases it): one claim; else (or where another backward holds a node of it) node by node.
  const std::shared_ptr<detail::StepReads>& step = detail::tape_log().reads;
  if (sig.source == capture::TapeSignature::Source::kLog && step &&
      e.nodes.size() == sig.nodes.size() && !sig.nodes.empty() &&
      sig.nodes.front()->step_reads() == step && sig.nodes.back()->step_reads() == step &&
      claims.claim_step(*step)) {
    if (!step->partial && !step->replayed.load(std::memory_order_acquire)) return;
    claims.release_all();  // a node of it released on its own: each is checked by its claim
  }
  for (std::uint32_t i : e.nodes) claims.add(*sig.nodes[i]);
}

std::shared_ptr<BackwardGraph::Executable> BackwardGraph::capture_or_update(
    Cache::Decision& decision, const Tensor& loss, cudaStream_t caller, GradWrite grad_write) {
  using Action = Cache::Action;
  const capture::TapeSignature& sig = signature_;
  std::shared_ptr<Executable> exec;
  // Capture: the eager executor runs the plan under stream capture from the caller's stream,
  // each other forward stream mapped onto a private capture stream.
  BackwardPlan plan =
      plan_for({loss}, grad_write,
               {.split_weight_grads = split_,
                .fuse_activation_epilogues = options_.backward.fuse_activation_epilogues});
  use_capture_streams(plan);
  auto fresh = std::make_shared<Executable>();
  if (sig.source == capture::TapeSignature::Source::kLog) {
    fresh->nodes_part = std::make_shared<const capture::Words>(
        sig.structure.begin(),
        sig.structure.begin() + static_cast<std::ptrdiff_t>(sig.nodes_words));
  }
  // Where the reached nodes and leaves are in this signature (and in every later step's with
  // the same structure): what a replay releases and records.
  const bool log = sig.source == capture::TapeSignature::Source::kLog;
  for (const Node* n : walk_.nodes) {
    const int i = log ? n->log_index : n->walk_index;
    GW_CHECK(i >= 0 && static_cast<std::size_t>(i) < sig.nodes.size() && sig.nodes[i] == n,
             "BackwardGraph: internal error: a node the backward reaches is missing from the "
             "step's signature");
    fresh->nodes.push_back(static_cast<std::uint32_t>(i));
  }
  for (const Tensor& leaf : walk_.leaves) {
    std::size_t l = 0;
    while (l < sig.leaves.size() && &sig.leaves[l].grad() != &leaf.grad()) ++l;
    GW_CHECK(l < sig.leaves.size(),
             "BackwardGraph: internal error: a leaf the backward "
             "reaches is missing from the step's signature");
    fresh->leaves.push_back(static_cast<std::uint32_t>(l));
  }
  // The same structure captured again (an update) reuses the entry's pool: the graph's memory
  // stays where the executable's kernels point.
  GraphMemoryPool* pool = nullptr;
  if (decision.action == Action::kUpdate) {
    pool = decision.entry->exec->pool.get();
  } else {
    fresh->pool = std::make_unique<GraphMemoryPool>(device_);
    pool = fresh->pool.get();
  }
  // Note [Input slots]: the saved tensors this graph reads from copies of its own.
  fresh->slots =
      choose_slots(decision.action == Action::kUpdate ? decision.entry : nullptr, grad_write);
  fill_slots(*fresh, caller);
  std::vector<std::shared_ptr<ReplayWatcher>> watchers;  // Note [Watched replays]
  fresh->graph = capture::Graph(capture_plan(plan, caller, *pool, /*timed=*/false, &watchers));
  fresh->stats = stats_of(fresh->graph.graph(), plan);  // the backward's nodes, not the fence
  fresh->fence = decision.action == Action::kUpdate ? decision.entry->exec->fence
                                                    : std::make_shared<Event>(device_);
  capture::append_event_record(fresh->graph.graph(), fresh->fence->get());
  fresh->description = std::make_shared<const std::string>(describe(plan, calls_, fresh->stats));
  fresh->graph.watch(watchers, fresh->description);
  fresh->stats.tape_nodes = fresh->nodes.size();
  fresh->stats.memory_bytes = pool->bytes();
  std::vector<capture::Unbound> unbound;
  for (std::size_t i = 0; i < fresh->slots.size(); ++i) {
    const InputSlot& slot = fresh->slots[i];
    unbound.push_back({slot.address, fresh->slots[slot.leader].address});
    if (slot.leader != i) continue;
    ++fresh->stats.input_slots;
    fresh->stats.input_slot_bytes += slot.copy.nbytes();
  }
  std::sort(unbound.begin(), unbound.end());
  bool updated = false;
  if (decision.action == Action::kUpdate) {
    Executable& old = *decision.entry->exec;
    detail::NvtxRange nvtx("BackwardGraph::update");
    const char* refused = old.graph.update_to(fresh->graph);
    if (!refused) {
      old.stats = fresh->stats;
      old.description = fresh->description;
      old.graph.watch(std::move(watchers), old.description);
      old.slots = std::move(fresh->slots);
      exec = decision.entry->exec;
      updated = true;
      last_reason_ = "update: " + decision.reason;
    } else {
      last_reason_ =
          "update refused (" + std::string(refused) + "), re-instantiated: " + decision.reason;
    }
  }
  if (!updated) {
    fresh->graph.instantiate();
    exec = fresh;
    if (decision.action == Action::kUpdate) {
      fresh->pool = std::move(decision.entry->exec->pool);  // the memory the new graph uses
      decision.entry->exec = fresh;
    } else {
      cache_.insert(sig, fresh, unbound);
      last_reason_ = "capture: " + decision.reason;
    }
  }
  if (decision.action == Action::kUpdate) {
    decision.entry->unbound = std::move(unbound);
    cache_.count_update(*decision.entry, sig);
  }
  last_captured_ = exec;
  return exec;
}

bool BackwardGraph::record_and_release(const Executable& exec, cudaStream_t caller) {
  capture::TapeSignature& sig = signature_;
  // The graph wrote the gradients and read the saved tensors on the caller's stream: record it, so
  // that later readers wait for it (rule [read after write]) and frees are ordered after it (rule
  // [reuse after use]); then release the step's saved tensors, as a backward without retain_graph
  // does. One event, recorded by the graph's last node (Note [A replay's fence]), covers every
  // saved tensor that another stream allocated.
  std::shared_ptr<const Event> fence = exec.fence;
  // The slots' copies read this step's tensors on the caller's stream (Note [Input slots]).
  for (const Tensor& src : slot_sources_) {
    if (src.storage()->used_only_on(caller)) continue;
    src.storage()->record_read(caller, fence);
  }
  slot_sources_.clear();
  // The .grads the graph wrote (Note [Writes of a replayed graph], engine/runtime/memory.h): the same
  // .grads of the same leaves as the last step's follow grad_writes_ (unless one of them left it
  // for another BackwardGraph's), and one bump writes them all; others are written here, from the
  // signature's memo where it has them (one pointer each), and follow a new GraphWrites from now
  // on.
  if (sig.grads_unchanged && !grad_writes_leaves_.empty() && grad_writes_leaves_ == exec.leaves &&
      !grad_writes_->abandoned.load(std::memory_order_acquire)) {
    grad_writes_->stream.store(caller, std::memory_order_relaxed);
    grad_writes_->epoch.fetch_add(1, std::memory_order_acq_rel);
  } else {
    grad_writes_leaves_.clear();
    grad_writes_ = std::make_shared<detail::GraphWrites>();
    grad_writes_->stream.store(caller, std::memory_order_relaxed);
    const bool memo = sig.source == capture::TapeSignature::Source::kLog &&
                      sig.grad_memo.size() == sig.leaves.size();
    for (std::uint32_t l : exec.leaves) {
      Storage* g = memo ? sig.grad_memo[l].grad_storage : nullptr;
      if (!g) g = sig.leaves[l].grad().storage().get();  // made for this capture
      g->record_use(caller, true);
      g->watch();
      g->follow_graph_writes(grad_writes_);
    }
    // The next step's signature compares its .grads with the memo: only .grads read from it are
    // known to be the next step's when it finds them unchanged.
    if (memo) grad_writes_leaves_ = exec.leaves;
  }
  // Note [Reads of a replayed step] (engine/runtime/memory.h): a step the tape log recorded, every node of
  // which the graph reached, is released as a whole — one record of the graph's read, filled in
  // here; the worker drops the saved tensors (Note [Deferred release]).
  const std::shared_ptr<detail::StepReads>& step = detail::tape_log().reads;
  const bool whole_step =
      sig.source == capture::TapeSignature::Source::kLog && step && !step->partial && !step->lost &&
      !step->replayed.load(std::memory_order_relaxed) && exec.nodes.size() == sig.nodes.size() &&
      !sig.nodes.empty() && sig.nodes.front()->step_reads() == step &&
      sig.nodes.back()->step_reads() == step;
  if (whole_step) {
    step->stream = caller;
    // A read on a storage's own allocating stream is ordered before any reuse of it already.
    if (step->any_saved && (step->mixed_streams || step->alloc_stream != caller)) {
      step->fence = fence;
    }
    step->replayed.store(true, std::memory_order_release);
    detail::tape_mutations().fetch_add(1, std::memory_order_acq_rel);  // Note [Tape log]
    releaser_.release_step(sig.nodes, sig.leaves, roots_.front());
  } else {
    // Node by node: the nodes are marked released here, the saved tensors themselves dropped on the
    // release worker's thread (Note [Deferred release], engine/tape/deferred_release.h).
    bool logged = false;
    for (std::uint32_t i : exec.nodes) {
      Node* n = sig.nodes[i];
      for (const SavedTensor& s : n->saved()) {
        if (!s.tensor.defined() || s.tensor.storage()->used_only_on(caller)) continue;
        s.tensor.storage()->record_read(caller, fence);
      }
      logged = logged || n->log_epoch != 0;
      n->release_saved(&hand_off_, /*count_mutation=*/false);
    }
    if (logged) detail::tape_mutations().fetch_add(1, std::memory_order_acq_rel);  // Note [Tape log]
    releaser_.release(hand_off_, roots_.front());
  }
  return whole_step;
}
#endif

std::vector<StepTiming> BackwardGraph::trace(const Tensor& loss, GradWrite grad_write) {
  check_thread("BackwardGraph::trace");
  std::lock_guard<std::mutex> lock(mutex_);
  check_loss(loss, "BackwardGraph::trace");
  GW_CHECK(device_.is_cuda(), "BackwardGraph::trace: times a replay of a CUDA graph; this "
                              "BackwardGraph is for ", device_.str(),
           " (the eager backward's trace: backward(loss, {.timings = &steps}))");
  check_capturable("BackwardGraph::trace");  // it synchronizes
  GW_CHECK(is_valid(grad_write), "BackwardGraph::trace: grad_write is GradWrite(",
           static_cast<int>(grad_write), "); expected GradWrite::kAccumulate or kOverwrite");
  const std::uint64_t warmed = program_calls_[static_cast<std::size_t>(grad_write)];
  GW_CHECK(warmed >= static_cast<std::uint64_t>(options_.warmup) && !options_.force_eager,
           "BackwardGraph::trace: call it after the warm-up (", options_.warmup,
           " backward() call(s) with this grad_write; so far ", warmed,
           ") so that library initialization happens outside the capture, and not with "
           "force_eager (there is no graph to trace; time the eager backward with "
           "backward(loss, {.timings = &steps}))");
  struct ResetLog {
    ~ResetLog() { detail::tape_log_reset(); }
  } reset_log;
#if GRAPHWARD_HAS_CUDA
  detail::NvtxRange nvtx("BackwardGraph::trace");
  DeviceGuard guard(device_);
  const cudaStream_t caller = current_stream(device_);
  ensure_seed(loss, caller);
  BackwardPlan plan =
      plan_for({loss}, grad_write,
               {.split_weight_grads = split_,
                .fuse_activation_epilogues = options_.backward.fuse_activation_epilogues});
  // As backward() does: the .grads the graph writes exist before the capture; the caller waits
  // where rule [read after write] needs it (the whole scan: trace() is not a hot path).
  NodeClaims claims(/*exclusive=*/true);  // Note [Backwards sharing a tape]: it frees them
  for (const BackwardPlan::Step& s : plan.steps) claims.add(*s.node);
  const NodeClaims::ThreadScope claims_held;
  std::vector<Tensor> leaves;
  for (const BackwardPlan::Buffer& b : plan.buffers) {
    if (b.kind == BackwardPlan::BufferKind::kLeaf) leaves.push_back(b.leaf);
  }
  make_missing_grads(leaves);
  order_before_launch(loss, caller, leaves, /*scan_grads=*/true);
  use_capture_streams(plan);
  GraphMemoryPool pool(device_);
  std::vector<std::shared_ptr<ReplayWatcher>> watchers;  // Note [Watched replays]
  capture::Graph owned(capture_plan(plan, caller, pool, /*timed=*/true, &watchers));
  owned.watch(std::move(watchers),
              std::make_shared<const std::string>("the traced backward graph (trace())"));
  owned.instantiate();
  {
    detail::NvtxRange launch("BackwardGraph::replay (traced)");
    owned.launch(caller);
  }
  GW_CUDA_CHECK(cudaStreamSynchronize(caller));
  std::vector<StepTiming> steps = executor_.read_timings(plan, device_);
  for (StepTiming& t : steps) t.host_us = 0;  // host time of the capture, not of a replay
  // The graph wrote the .grads on the caller's stream, and is done with the saved tensors.
  for (const Tensor& leaf : leaves) leaf.grad().storage()->record_use(caller, true);
  for (const BackwardPlan::Step& s : plan.steps) s.node->release_saved();
  trace_stream_names_ = stream_names(plan, options_.backward.reduce_gradients != nullptr);
  return steps;
#else
  (void)grad_write;
  return {};
#endif
}

BackwardGraphStats BackwardGraph::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  BackwardGraphStats st;
  st.counters = cache_.counters();
  st.eager_backwards = eager_;
  st.log_signatures = log_signatures_;
  st.cached_graphs = cache_.size();
  st.signature_from_log = last_from_log_;
  st.matched_in_forward = last_matched_in_forward_;
  st.walk_reason = signature_.walk_reason;
  st.reason = last_reason_;
  st.graph = last_stats_;
  st.host = host_;
  return st;
}

void BackwardGraph::write_dot(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mutex_);
#if GRAPHWARD_HAS_CUDA
  GW_CHECK(last_captured_ && last_captured_->graph,
           "BackwardGraph::write_dot: no graph has been captured yet");
  last_captured_->graph.write_dot(path);
#else
  (void)path;
  GW_CHECK(false, "BackwardGraph::write_dot: graphward was built without CUDA");
#endif
}

}  // namespace graphward
