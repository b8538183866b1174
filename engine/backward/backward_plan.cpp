#include "graphward/engine/backward/backward_plan.h"

#include "graphward/engine/backward/backward_program.h"

#include "graphward/engine/runtime/ptr_index.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace graphward {

// Note [Gradient buffers]
// Every node reached by the backward has one kGrad buffer: the gradient of its output, consumed
// by the node's own step on the node's stream (S). Its contributions, in plan order, are routed so
// that accumulation happens on S (rule [cross-stream gradients]) and costs no extra kernel where it
// need not:
//   * a sole contributor writes the buffer directly (=), on its own stream; S waits for it;
//   * otherwise contributors on S write directly (the first =, later +=), and each contributor on
//     another stream P writes a kStaged buffer of its own on P, which the owner adds in (on S,
//     after waiting for P) just before it runs; a root's seed is added the same way.
// Leaf gradients are written by each contributor on the contributor's own stream (rule [leaf
// gradients]), in plan order: the first writes (GradWrite::kOverwrite) or adds (kAccumulate), later
// ones add, and a contributor on another stream than the previous one waits for it.

namespace {

// plan_backward's passes, in order, over one plan under construction. Each pass reads what the
// passes before it left (the members below) and fills its part of the plan.
class Planner {
 public:
  Planner(const std::vector<PlanRoot>& roots, cudaStream_t caller_stream, GradWrite grad_write)
      : roots_(roots), grad_write_(grad_write) {
    GW_CHECK(!roots.empty(), "backward: expected at least one root");
    plan_.grad_write = grad_write;
    plan_.streams.push_back(caller_stream);
  }
  void discover();
  void order();
  void make_buffers();
  void split_weight_grads();
  void route_and_wait();
  void fuse_activation_epilogues();
  void fork_and_join();
  BackwardPlan take() { return std::move(plan_); }

 private:
  int discover_node(Node* n);
  int leaf_buffer_of(const Tensor& leaf);
  void depend(int consumer, bool consumer_side, int key);
  void wait_for_producers(int s, bool side);
  void route_writes(int s);
  void advance_clocks(int s);

  const std::vector<PlanRoot>& roots_;
  const GradWrite grad_write_;
  BackwardPlan plan_;
  // 1. discover: the nodes reachable from the roots (by discovery index), how many edges of
  // reachable nodes point at each not yet run, and per node and input the discovery index of the
  // input's node or -1 (a leaf or no edge), looked up once here and read by every later pass.
  detail::PtrIndex index_{64};
  std::vector<Node*> nodes_;
  std::vector<int> pending_;
  std::vector<std::vector<int>> input_node_;
  std::vector<int> stack_;
  // 2. order: each node's step and each step's node.
  std::vector<int> step_of_, node_of_step_;
  // 3. make_buffers: the kLeaf buffer of each leaf, keyed by its shared .grad slot.
  detail::PtrIndex leaf_buffer_{64};
  int num_steps_ = 0;
  int num_forward_streams_ = 0;
  // 4. route_and_wait: a vector clock per stream — clock_[s][p] is the last step of stream p that
  // stream s is known to follow (a side stream runs at most one part per step, so step numbers
  // order its work too). A producer is a key 2·step (the step on its stream) or 2·step + 1 (its
  // side part): keys order every part. snapshot_ holds each key's clock; grad_written_ counts
  // the direct writes of each buffer so far; leaf_last_writer_ is each leaf's last writer (a key);
  // follows_caller_ says per stream whether its first step is ordered after a step of the
  // caller's stream by its waits (then it needs no fork), -1 while the stream has had no step.
  int k_ = 0;
  std::vector<std::vector<int>> clock_;
  std::vector<int> snapshot_, grad_written_, leaf_last_writer_, follows_caller_, producers_;
};

int Planner::discover_node(Node* n) {
  const auto [i, inserted] = index_.emplace(n, static_cast<int>(nodes_.size()));
  if (inserted) {
    nodes_.push_back(n);
    pending_.push_back(0);
    input_node_.emplace_back();
    stack_.push_back(i);
  }
  return i;
}

// 1. The nodes reachable from the roots, and how many edges point at each (dependencies).
void Planner::discover() {
  nodes_.reserve(64);
  for (const PlanRoot& r : roots_) {
    if (r.node) {
      plan_.owners.push_back(r.node);
      discover_node(r.node.get());
    } else {
      GW_CHECK(r.leaf.defined(), "backward: a root is neither a recorded result nor a leaf");
    }
  }
  Device device = Device::cpu();
  bool have_device = false;
  while (!stack_.empty()) {
    const int ni = stack_.back();
    stack_.pop_back();
    Node* n = nodes_[ni];
    GW_CHECK(!n->released(), n->released_message());
    if (!have_device) {
      device = n->device();
      have_device = true;
    }
    GW_CHECK(n->device() == device, "backward: the graph spans devices (", n->label(), " ran on ",
             n->device().str(), ", others on ", device.str(),
             "); expected every node on one device");
    std::vector<int> owners;
    owners.reserve(n->inputs().size());
    for (const InputMeta& in : n->inputs()) {
      // A gradient flows in its producer's output shape: a grad_fn of another shape (set by
      // hand, Tensor::set_grad_fn) would hand that shape on to the leaves' .grads.
      GW_CHECK(!in.edge.node || in.edge.node->output_shape() == in.shape, "backward: ", n->label(),
               " read a tensor of shape ", shape_str(in.shape), " whose grad_fn ",
               in.edge.node ? in.edge.node->label() : "", " outputs ",
               in.edge.node ? shape_str(in.edge.node->output_shape()) : "",
               "; expected a grad_fn of the tensor's own shape (Tensor::set_grad_fn)");
      const int o = in.edge.node ? discover_node(in.edge.node.get()) : -1;
      if (o >= 0) ++pending_[o];
      owners.push_back(o);
    }
    input_node_[ni] = std::move(owners);
  }
}

// 2. Order: a node runs once every node that feeds its gradient has run; among ready nodes the
// most recently created goes first (the reverse of the forward's issue order).
void Planner::order() {
  auto later = [&](int a, int b) { return nodes_[a]->sequence_nr() < nodes_[b]->sequence_nr(); };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (pending_[i] == 0) ready.push(static_cast<int>(i));
  }
  step_of_.assign(nodes_.size(), -1);
  node_of_step_.reserve(nodes_.size());
  plan_.steps.reserve(nodes_.size());
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    Node* n = nodes_[i];
    step_of_[i] = static_cast<int>(plan_.steps.size());
    node_of_step_.push_back(i);
    BackwardPlan::Step step;
    step.node = n;
    // Streams are few: a linear search beats a hash map.
    const auto it = std::find(plan_.streams.begin(), plan_.streams.end(), n->stream());
    step.stream = static_cast<int>(it - plan_.streams.begin());
    if (it == plan_.streams.end()) plan_.streams.push_back(n->stream());
    plan_.steps.push_back(std::move(step));
    for (const int o : input_node_[i]) {
      if (o >= 0 && --pending_[o] == 0) ready.push(o);
    }
  }
  GW_CHECK(plan_.steps.size() == nodes_.size(), "backward: the graph has a cycle");
  num_steps_ = static_cast<int>(plan_.steps.size());
}

int Planner::leaf_buffer_of(const Tensor& leaf) {
  const auto [found, inserted] =
      leaf_buffer_.emplace(&leaf.grad(), static_cast<int>(plan_.buffers.size()));
  if (inserted) {
    BackwardPlan::Buffer b;
    b.kind = BackwardPlan::BufferKind::kLeaf;
    b.leaf = leaf;
    b.shape = leaf.shape();
    plan_.buffers.push_back(std::move(b));
  }
  return found;
}

// 3. Buffers: one kGrad per step; one kLeaf per leaf reached; contributors in plan order.
void Planner::make_buffers() {
  plan_.buffers.reserve(2 * static_cast<std::size_t>(num_steps_));
  for (int s = 0; s < num_steps_; ++s) {
    BackwardPlan::Buffer b;
    b.kind = BackwardPlan::BufferKind::kGrad;
    b.owner = s;
    b.shape = plan_.steps[s].node->output_shape();
    b.stream = plan_.steps[s].stream;
    b.last_use = s;
    plan_.steps[s].grad_buffer = static_cast<int>(plan_.buffers.size());
    plan_.buffers.push_back(std::move(b));
  }
  plan_.root_steps.assign(roots_.size(), -1);
  for (std::size_t r = 0; r < roots_.size(); ++r) {
    if (roots_[r].node) {
      const int s = step_of_[index_.at(roots_[r].node.get())];
      plan_.root_steps[r] = s;
      plan_.buffers[plan_.steps[s].grad_buffer].contributors.push_back(BackwardPlan::kSeed);
      plan_.steps[s].seeds.push_back(static_cast<int>(r));
    } else {
      const int b = leaf_buffer_of(roots_[r].leaf);
      plan_.buffers[b].contributors.push_back(BackwardPlan::kSeed);
    }
  }
  for (int s = 0; s < num_steps_; ++s) {
    const auto& inputs = plan_.steps[s].node->inputs();
    const std::vector<int>& owners = input_node_[node_of_step_[s]];
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      if (owners[j] >= 0) {
        plan_.buffers[plan_.steps[step_of_[owners[j]]].grad_buffer].contributors.push_back(s);
      } else if (inputs[j].edge.leaf.defined()) {
        plan_.buffers[leaf_buffer_of(inputs[j].edge.leaf)].contributors.push_back(s);
      }
    }
  }
  for (BackwardPlan::Buffer& b : plan_.buffers) {
    b.first_use = b.contributors.empty() ? b.owner : b.contributors.front();
    if (b.kind == BackwardPlan::BufferKind::kLeaf && !b.contributors.empty()) {
      b.last_use = b.contributors.back();
    }
  }
  num_forward_streams_ = static_cast<int>(plan_.streams.size());
  plan_.side_of.assign(plan_.streams.size(), -1);
}

// 3b. Weight-gradient parallelism (opt-in): a step with both a node-edge input (the critical
// path) and leaf inputs gets a side stream per forward stream for its leaf gradients.
void Planner::split_weight_grads() {
  std::vector<int> side_for(plan_.streams.size(), -1);
  for (int s = 0; s < num_steps_; ++s) {
    BackwardPlan::Step& step = plan_.steps[s];
    bool node_edge = false, leaf_edge = false;
    for (const InputMeta& in : step.node->inputs()) {
      node_edge = node_edge || in.edge.node != nullptr;
      leaf_edge = leaf_edge || (!in.edge.node && in.edge.leaf.defined());
    }
    if (!node_edge || !leaf_edge) continue;
    int& side = side_for[static_cast<std::size_t>(step.stream)];
    if (side < 0) {
      side = static_cast<int>(plan_.streams.size());
      plan_.streams.push_back(nullptr);
      plan_.side_of.push_back(step.stream);
    }
    step.side_stream = side;
  }
}

// The consumer (step `consumer`, or its side part) waits for the producer `key` unless its stream
// already follows it.
void Planner::depend(int consumer, bool consumer_side, int key) {
  if (key < 0) return;  // the seed / the caller: covered by the fork
  const int producer = key / 2;
  const bool producer_side = key % 2 == 1;
  BackwardPlan::Step& c = plan_.steps[consumer];
  BackwardPlan::Step& p = plan_.steps[producer];
  const int cs = consumer_side ? c.side_stream : c.stream;
  const int ps = producer_side ? p.side_stream : p.stream;
  if (cs == ps || clock_[cs][ps] >= producer) return;
  int& event = producer_side ? p.side_event : p.event;
  if (event < 0) event = plan_.num_events++;
  (consumer_side ? c.side_waits : c.waits).push_back(static_cast<int>(plan_.waits.size()));
  plan_.waits.push_back({producer, consumer, event, producer_side, consumer_side});
  const int* seen = &snapshot_[static_cast<std::size_t>(key) * k_];
  for (int x = 0; x < k_; ++x) clock_[cs][x] = std::max(clock_[cs][x], seen[x]);
}

// Step s's waits (its side part's with `side`). The producers of the step: the contributors of
// its gradient, and the previous writer of every leaf it writes on its stream (writers of one .grad
// are serialized across streams); of its side part: the previous writers of its leaves. Waits are
// placed latest first: a wait on step q covers only steps before q, so no later-placed wait can
// make an earlier one redundant, and every wait placed is necessary.
void Planner::wait_for_producers(int s, bool side) {
  const BackwardPlan::Step& step = plan_.steps[s];
  const auto& inputs = step.node->inputs();
  const std::vector<int>& owners = input_node_[node_of_step_[s]];
  const bool split = step.side_stream >= 0;
  producers_.clear();
  if (!side) {
    for (int c : plan_.buffers[step.grad_buffer].contributors) {
      producers_.push_back(c < 0 ? c : 2 * c);  // contributions come from steps, never side parts
    }
  }
  if (side || !split) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (owners[i] < 0 && inputs[i].edge.leaf.defined()) {
        producers_.push_back(leaf_last_writer_[leaf_buffer_of(inputs[i].edge.leaf)]);
      }
    }
  }
  std::sort(producers_.begin(), producers_.end(), std::greater<int>());
  producers_.erase(std::unique(producers_.begin(), producers_.end()), producers_.end());
  for (int q : producers_) depend(s, side, q);
}

// Where step s writes each input's gradient (Note [Gradient buffers]).
void Planner::route_writes(int s) {
  BackwardPlan::Step& step = plan_.steps[s];
  const auto& inputs = step.node->inputs();
  const std::vector<int>& owners = input_node_[node_of_step_[s]];
  const bool split = step.side_stream >= 0;
  step.writes.assign(inputs.size(), {});
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Edge& e = inputs[i].edge;
    if (owners[i] >= 0) {
      const int owner = step_of_[owners[i]];
      const int gb = plan_.steps[owner].grad_buffer;
      BackwardPlan::Buffer& target = plan_.buffers[gb];
      const bool sole = target.contributors.size() == 1;
      if (sole || plan_.steps[owner].stream == step.stream) {
        step.writes[i] = {gb, grad_written_[gb]++ > 0};
      } else {
        BackwardPlan::Buffer staged;
        staged.kind = BackwardPlan::BufferKind::kStaged;
        staged.owner = owner;
        staged.target = gb;
        staged.shape = target.shape;
        staged.stream = step.stream;
        staged.contributors = {s};
        staged.first_use = s;
        staged.last_use = owner;
        const int sb = static_cast<int>(plan_.buffers.size());
        plan_.buffers.push_back(std::move(staged));
        plan_.steps[owner].staged.push_back(sb);
        step.writes[i] = {sb, false};
      }
    } else if (e.leaf.defined()) {
      const int lb = leaf_buffer_of(e.leaf);
      const bool first = grad_written_[lb]++ == 0;
      step.writes[i] = {lb, !first || grad_write_ == GradWrite::kAccumulate};
      leaf_last_writer_[lb] = 2 * s + (split ? 1 : 0);
    }
  }
}

// Step s has run: its stream (and its side stream) now follow it.
void Planner::advance_clocks(int s) {
  const BackwardPlan::Step& step = plan_.steps[s];
  if (step.side_stream >= 0) {
    clock_[step.side_stream][step.side_stream] = s;
    std::copy(clock_[step.side_stream].begin(), clock_[step.side_stream].end(),
              snapshot_.begin() + static_cast<std::ptrdiff_t>(2 * s + 1) * k_);
  }
  clock_[step.stream][step.stream] = s;
  std::copy(clock_[step.stream].begin(), clock_[step.stream].end(),
            snapshot_.begin() + static_cast<std::ptrdiff_t>(2 * s) * k_);
}

// 4. Route every contribution (Note [Gradient buffers]) and place the waits.
void Planner::route_and_wait() {
  k_ = static_cast<int>(plan_.streams.size());
  clock_.assign(k_, std::vector<int>(k_, -1));
  snapshot_.assign(static_cast<std::size_t>(2 * num_steps_) * k_, 0);
  grad_written_.assign(plan_.buffers.size(), 0);
  leaf_last_writer_.assign(plan_.buffers.size(), BackwardPlan::kSeed);
  follows_caller_.assign(k_, -1);
  // Leaf roots: the seed is the first contribution.
  for (std::size_t r = 0; r < roots_.size(); ++r) {
    if (roots_[r].node) continue;
    const int b = leaf_buffer_of(roots_[r].leaf);
    const bool first = grad_written_[b]++ == 0;
    plan_.leaf_seeds.push_back(
        {static_cast<int>(r), b, !first || grad_write_ == GradWrite::kAccumulate});
  }
  for (int s = 0; s < num_steps_; ++s) {
    BackwardPlan::Step& step = plan_.steps[s];
    // The contributions this step consumes were all made by earlier steps.
    wait_for_producers(s, false);
    if (follows_caller_[step.stream] < 0) {
      follows_caller_[step.stream] = clock_[step.stream][0] >= 0;
    }
    if (step.side_stream >= 0) {
      // The side part starts from this step's stream once the gradient is assembled (the fork
      // event), then waits for the previous writers of its leaves.
      const int side = step.side_stream;
      step.side_fork_event = plan_.num_events++;
      for (int x = 0; x < k_; ++x) {
        clock_[side][x] = std::max(clock_[side][x], clock_[step.stream][x]);
      }
      wait_for_producers(s, true);
    }
    route_writes(s);
    advance_clocks(s);
  }
}

// 5. Note [Backward epilogue fusion] (engine/ops/ops.h): a linear+activation layer P hands its
// activation backward to the linear layer C that consumes its output when nothing else can see
// the difference: C and P on one stream, C's the only contribution to P's output gradient (no
// seed, no staged part: P's output feeds C alone) and a plain write (=). Nothing moves between
// streams or steps: C writes P's gradient buffer as before, only its contents change.
void Planner::fuse_activation_epilogues() {
  for (int c = 0; c < num_steps_; ++c) {
    BackwardPlan::Step& cs = plan_.steps[c];
    const std::vector<int>& owners = input_node_[node_of_step_[c]];
    if (!cs.node->takes_input_epilogue() || owners.empty() || owners[0] < 0) continue;
    const int p = step_of_[owners[0]];
    BackwardPlan::Step& ps = plan_.steps[p];
    if (!ps.node->activation_fusion() || cs.stream != ps.stream ||
        cs.writes[0].buffer != ps.grad_buffer || cs.writes[0].accumulate || !ps.staged.empty() ||
        !ps.seeds.empty() || plan_.buffers[ps.grad_buffer].contributors != std::vector<int>{c}) {
      continue;
    }
    cs.fuses_activation_of = p;
    ps.preactivation_grad = true;
  }
}

// 6. Forks and joins: every stream the backward uses other than the caller's (rule [fork and
// join]). Side streams start from their forward stream inside a step (after it was forked): joined
// only. A stream whose first step waits for a step of the caller's stream (directly or through
// other streams) is not forked: that wait orders all of its work after everything before the call,
// as the fork would (the seeds included: the caller's steps come after them).
void Planner::fork_and_join() {
  for (int x = 1; x < k_; ++x) {
    if (x < num_forward_streams_ && follows_caller_[x] != 1) plan_.forks.push_back(x);
    plan_.joins.push_back(x);
  }
}

}  // namespace

BackwardPlan plan_backward(const std::vector<PlanRoot>& roots, cudaStream_t caller_stream,
                           GradWrite grad_write, PlanOptions options) {
  GW_CHECK(is_valid(grad_write), "backward: grad_write is GradWrite(", static_cast<int>(grad_write),
           "); expected GradWrite::kAccumulate or kOverwrite");
  Planner planner(roots, caller_stream, grad_write);
  planner.discover();
  planner.order();
  planner.make_buffers();
  if (options.split_weight_grads) planner.split_weight_grads();
  planner.route_and_wait();
  if (options.fuse_activation_epilogues) planner.fuse_activation_epilogues();
  planner.fork_and_join();
  return planner.take();
}

namespace {
const char* kind_name(BackwardPlan::BufferKind k) {
  switch (k) {
    case BackwardPlan::BufferKind::kGrad:
      return "grad";
    case BackwardPlan::BufferKind::kStaged:
      return "staged";
    case BackwardPlan::BufferKind::kLeaf:
      return "leaf";
  }
  return "?";
}
}  // namespace

namespace {
// Note [Gradient buckets]: when each step's writes are done, estimated by running the plan with
// one unit of time a step (and one for a split step's side part): a stream runs its steps in plan
// order, each after its stream's previous one and after the steps it waits for; a side part
// starts with its step (its fork is recorded once the gradient is assembled). Exact for one
// stream (the plan order); across streams it finds the leaves that are ready together. A step
// whose node passes its gradient through (Node::passes_gradient_through: the adds that sum
// branches) takes no time: counted as a unit, the chain of adds that joins K branches would start
// each branch's backward one unit after the one before, and a bucket "ready together" would
// hold the first layer of one branch with the second or third of another — the reduction of
// the 4-branch study's first bucket started two layers after its first layers were done.
struct FinishTimes {
  std::vector<double> main, side;  // per step (side: -1 when the step is not split)
};
FinishTimes estimate_finish_times(const BackwardPlan& plan) {
  const std::size_t n = plan.steps.size();
  FinishTimes t{std::vector<double>(n, 0.0), std::vector<double>(n, -1.0)};
  std::vector<double> stream_free(plan.streams.size(), 0.0);
  auto ready_after = [&](double start, const std::vector<int>& waits) {
    for (int w : waits) {
      const BackwardPlan::Wait& wait = plan.waits[static_cast<std::size_t>(w)];
      const auto p = static_cast<std::size_t>(wait.producer);
      start = std::max(start, wait.producer_side ? t.side[p] : t.main[p]);
    }
    return start;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const BackwardPlan::Step& st = plan.steps[i];
    double& free_main = stream_free[static_cast<std::size_t>(st.stream)];
    const double start = ready_after(free_main, st.waits);
    t.main[i] = free_main = start + (st.node && st.node->passes_gradient_through() ? 0 : 1);
    if (st.side_stream >= 0) {
      double& free_side = stream_free[static_cast<std::size_t>(st.side_stream)];
      t.side[i] = free_side = ready_after(std::max(free_side, start), st.side_waits) + 1;
    }
  }
  return t;
}
}  // namespace

std::vector<GradBucket> plan_grad_buckets(const BackwardPlan& plan, std::size_t bucket_bytes,
                                          std::size_t first_bucket_bytes) {
  GW_CHECK(bucket_bytes > 0, "plan_grad_buckets: expected a bucket size above 0 bytes");
  if (first_bucket_bytes == 0) first_bucket_bytes = bucket_bytes;
  struct Final {
    int buffer;
    int step;
    double finish;  // the estimated time its last write is done (0: the seeds)
  };
  const FinishTimes times = estimate_finish_times(plan);
  std::vector<Final> leaves;
  for (std::size_t b = 0; b < plan.buffers.size(); ++b) {
    const BackwardPlan::Buffer& buf = plan.buffers[b];
    if (buf.kind != BackwardPlan::BufferKind::kLeaf) continue;
    const int step = buf.last_use;
    double finish = 0;
    if (step >= 0) {
      const auto s = static_cast<std::size_t>(step);
      finish = plan.steps[s].side_stream >= 0 ? times.side[s] : times.main[s];
    }
    leaves.push_back({static_cast<int>(b), step, finish});
  }
  std::stable_sort(leaves.begin(), leaves.end(), [](const Final& a, const Final& b) {
    return a.finish != b.finish ? a.finish < b.finish : a.step < b.step;
  });
  std::vector<GradBucket> buckets;
  double last_finish = -1;  // of the last leaf taken
  for (const Final& f : leaves) {
    // A full bucket closes — but not between two leaves estimated to be ready together: keeping
    // them makes the bucket wait for nothing more, and splitting them would add a reduction.
    if (buckets.empty() ||
        (buckets.back().bytes >= (buckets.size() == 1 ? first_bucket_bytes : bucket_bytes) &&
         f.finish != last_finish)) {
      buckets.emplace_back();
    }
    last_finish = f.finish;
    GradBucket& bucket = buckets.back();
    const Tensor& leaf = plan.buffers[f.buffer].leaf;
    bucket.buffers.push_back(f.buffer);
    bucket.bytes += static_cast<std::size_t>(leaf.numel()) * dtype_size(leaf.dtype());
    bucket.issue_after = std::max(bucket.issue_after, f.step);
    // Where the write happens: the step's stream, or its side stream (its leaf gradients).
    const bool side = f.step >= 0 && plan.steps[f.step].side_stream >= 0;
    const int stream = f.step < 0 ? 0
                       : side     ? plan.steps[f.step].side_stream
                                  : plan.steps[f.step].stream;
    auto same_stream = [&](const GradBucket::Ready& r) {
      if (r.step < 0) return stream == 0;  // the seeds are written on the caller's stream
      const BackwardPlan::Step& st = plan.steps[r.step];
      return (r.side ? st.side_stream : st.stream) == stream;
    };
    auto it = std::find_if(bucket.ready.begin(), bucket.ready.end(), same_stream);
    if (it == bucket.ready.end()) {
      bucket.ready.push_back({f.step, side});
    } else if (f.step > it->step) {
      *it = {f.step, side};
    }
  }
  // The buckets are reduced in their order on one stream: a bucket is issued no earlier than
  // the one before it (across streams, a later bucket's steps may come earlier in plan order).
  for (std::size_t k = 1; k < buckets.size(); ++k) {
    buckets[k].issue_after = std::max(buckets[k].issue_after, buckets[k - 1].issue_after);
  }
  return buckets;
}

std::string BackwardPlan::dump() const {
  std::ostringstream os;
  os << "BackwardPlan: " << steps.size() << " steps, " << streams.size() << " streams, "
     << waits.size() << " waits, " << buffers.size() << " buffers, grad_write="
     << (grad_write == GradWrite::kAccumulate ? "accumulate" : "overwrite") << "\n";
  for (std::size_t s = 0; s < streams.size(); ++s) {
    os << "  stream s" << s << " = " << static_cast<const void*>(streams[s])
       << (s == 0 ? " (caller)" : "");
    if (s < side_of.size() && side_of[s] >= 0) os << " (side stream of s" << side_of[s] << ")";
    os << "\n";
  }
  if (!moved_streams.empty()) {  // Note [Streams of an eager backward]
    os << "  on the caller's stream: the steps of";
    for (cudaStream_t m : moved_streams) os << " " << static_cast<const void*>(m);
    os << "; the caller waits for";
    for (cudaStream_t m : caller_waits) os << " " << static_cast<const void*>(m);
    os << "\n";
  }
  os << "  fork:";
  for (int f : forks) os << " s" << f;
  os << "\n  join:";
  for (int j : joins) os << " s" << j;
  os << "\n";
  for (const LeafSeed& ls : leaf_seeds) {
    os << "  seed of root " << ls.root << " -> b" << ls.buffer << (ls.accumulate ? " +=" : " =")
       << "\n";
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    os << "  step " << i << ": " << st.node->label() << " on s" << st.stream << ", grad b"
       << st.grad_buffer;
    for (int w : st.waits) {
      os << ", waits e" << waits[w].event << " (step " << waits[w].producer << ")";
    }
    for (int r : st.seeds) os << ", + seed of root " << r;
    for (int b : st.staged) os << ", + b" << b;
    os << " ->";
    for (std::size_t j = 0; j < st.writes.size(); ++j) {
      const Write& w = st.writes[j];
      os << " in" << j << ":";
      if (w.buffer < 0) {
        os << "-";
      } else {
        os << "b" << w.buffer << (w.accumulate ? "+=" : "=");
      }
    }
    if (st.side_stream >= 0) {
      os << ", leaf grads on side s" << st.side_stream << " (after e" << st.side_fork_event;
      for (int w : st.side_waits) os << ", e" << waits[w].event;
      os << ")";
      if (st.side_event >= 0) os << " recording e" << st.side_event;
    }
    if (st.fuses_activation_of >= 0) {
      os << ", in0 through step " << st.fuses_activation_of << "'s activation";
    }
    if (st.preactivation_grad) os << ", from the pre-activation";
    if (st.event >= 0) os << ", records e" << st.event;
    os << "\n";
  }
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    const Buffer& buf = buffers[b];
    os << "  b" << b << ": " << kind_name(buf.kind) << " " << shape_str(buf.shape);
    if (buf.kind != BufferKind::kLeaf)
      os << " on s" << buf.stream << ", read by step " << buf.owner;
    if (buf.kind == BufferKind::kStaged) os << " into b" << buf.target;
    os << ", written by [";
    for (std::size_t c = 0; c < buf.contributors.size(); ++c) {
      if (c) os << ", ";
      if (buf.contributors[c] == kSeed) {
        os << "seed";
      } else {
        os << "step " << buf.contributors[c];
      }
    }
    os << "], uses " << buf.first_use << ".." << buf.last_use << "\n";
  }
  // What a run issues (Note [The backward program]): a CUDA plan's events, a CPU plan's without.
  const bool cuda = !steps.empty() && steps.front().node->device().is_cuda();
  os << lower_plan(*this, {}, cuda).dump(*this);
  return os.str();
}

}  // namespace graphward
