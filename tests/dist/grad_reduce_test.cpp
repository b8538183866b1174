// Data parallelism on the CPU backend (Note [Gradient buckets], Note [Gradient reduction]): the
// buckets take the leaves in the order their gradients become final and close at their size; the
// executor hands the reducer every leaf gradient once, after its last write and before anything
// writes it again; the layout a reducer must agree on follows the model; a ProcessGroup of one on
// the CPU changes nothing; bad groups are refused by name.
#include "graphward/capture/backward_graph.h"
#include "graphward/dist/process_group.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace graphward {
namespace {
using testing::values;

// Three layers; w1 is used twice (by the first and the last layer), so its gradient is final only
// after the step of the first layer, the last the backward runs.
struct Model {
  Tensor w1 = randn({6, 6}, 1).set_requires_grad(true);
  Tensor b1 = randn({6}, 2).set_requires_grad(true);
  Tensor w2 = randn({6, 6}, 3).set_requires_grad(true);
  Tensor b2 = randn({6}, 4).set_requires_grad(true);
  Tensor w3 = randn({3, 6}, 5).set_requires_grad(true);
  std::vector<Tensor> params() const { return {w1, b1, w2, b2, w3}; }
  Tensor loss(const Tensor& x) const {
    const Tensor h1 = graphward::tanh(linear(x, w1, b1));
    const Tensor h2 = graphward::tanh(linear(h1, w2, b2));
    const Tensor h3 = linear(linear(h2, w1), w3);  // w1 again, last in the forward
    return sum(mul(h3, h3));
  }
};

// Records what it is given; "averages" with a second process that holds zeros (halves).
class RecordingReducer final : public GradientReducer {
 public:
  explicit RecordingReducer(std::size_t bytes) : bytes_(bytes) {}
  std::size_t bucket_bytes() const override { return bytes_; }
  cudaStream_t stream() const override { return nullptr; }
  void agree(std::uint64_t layout, const std::string& description, bool in_capture) override {
    layouts.push_back(layout);
    descriptions.push_back(description);
    EXPECT_FALSE(in_capture);
  }
  void reduce(const std::vector<Tensor>& grads) override {
    std::vector<const void*> bucket;
    for (const Tensor& g : grads) {
      bucket.push_back(g.storage().get());
      seen[g.storage().get()] = values(g);  // its value when handed over: must be final
      const std::vector<double> half = [&] {
        std::vector<double> v = values(g);
        for (double& x : v) x *= 0.5;
        return v;
      }();
      std::copy(half.begin(), half.end(), g.data<float>());
    }
    buckets.push_back(bucket);
  }
  std::vector<std::uint64_t> layouts;
  std::vector<std::string> descriptions;
  std::vector<std::vector<const void*>> buckets;
  std::map<const void*, std::vector<double>> seen;

 private:
  std::size_t bytes_;
};

TEST(GradBuckets, LeavesComeInTheOrderTheirGradientsAreFinalAndBucketsCloseAtTheirSize) {
  Model m;
  const Tensor loss = m.loss(randn({4, 6}, 9));
  const BackwardPlan plan = plan_for({loss});
  const std::vector<GradBucket> one = plan_grad_buckets(plan, std::size_t{1} << 30);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].buffers.size(), 5u);
  EXPECT_EQ(one[0].bytes, (36 + 6 + 36 + 6 + 18) * sizeof(float));
  // w3 is final first (the last layer's step runs first); w1 and b1 last (w1's first use, with
  // b1, runs last).
  EXPECT_EQ(&plan.buffers[one[0].buffers.front()].leaf.grad(), &m.w3.grad());
  std::vector<const Tensor*> last_two;
  for (std::size_t j = 3; j < 5; ++j) last_two.push_back(&plan.buffers[one[0].buffers[j]].leaf.grad());
  EXPECT_TRUE(std::count(last_two.begin(), last_two.end(), &m.w1.grad()) == 1 &&
              std::count(last_two.begin(), last_two.end(), &m.b1.grad()) == 1)
      << plan.dump();
  int last = -1;
  for (int b : one[0].buffers) {
    EXPECT_GE(plan.buffers[b].last_use, last) << plan.dump();
    last = plan.buffers[b].last_use;
  }
  EXPECT_EQ(one[0].issue_after, static_cast<int>(plan.steps.size()) - 1);
  ASSERT_EQ(one[0].ready.size(), 1u);  // one stream on the CPU
  EXPECT_EQ(one[0].ready[0].step, one[0].issue_after);

  // 50 bytes a bucket: each closes once it holds 50 bytes or more — but a layer's weight and
  // bias, written by one step, stay together: {w3}, {w2, b2}, {w1, b1}; every leaf once.
  const std::vector<GradBucket> small = plan_grad_buckets(plan, 50);
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small[1].bytes, (36 + 6) * sizeof(float));
  EXPECT_EQ(small[2].bytes, (36 + 6) * sizeof(float));
  std::vector<int> all;
  for (std::size_t k = 0; k < small.size(); ++k) {
    if (k + 1 < small.size()) {
      EXPECT_GE(small[k].bytes, 50u);
    }
    if (k > 0) {
      EXPECT_GE(small[k].issue_after, small[k - 1].issue_after);
    }
    for (int b : small[k].buffers) {
      all.push_back(b);
      EXPECT_LE(plan.buffers[b].last_use, small[k].issue_after);
    }
  }
  EXPECT_EQ(all, one[0].buffers);
  // A smaller first bucket: it closes at 100 bytes, the next holds the rest.
  const std::vector<GradBucket> first = plan_grad_buckets(plan, std::size_t{1} << 30, 100);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_GE(first[0].bytes, 100u);
  EXPECT_LT(first[0].issue_after, first[1].issue_after);
  EXPECT_EQ(first[0].bytes + first[1].bytes, one[0].bytes);
  GW_EXPECT_ERROR(plan_grad_buckets(plan, 0), "bucket size");
}

// Two branches on two streams, as a plan of the caller's stream (s0) and a branch stream (s1):
// the root's step on s0, then in plan order branch B's three steps on s1 (the first waits for the
// root), then branch A's three on s0. Each step writes one leaf of 64 floats; a split step writes
// its leaf on a side stream. Plan order would bucket all of B (its first layer's gradient, ready
// last, too) before A's last layer; the estimated order pairs the leaves ready together.
// Appends a step on `stream` (of `node`, or none) that, with `leaf`, alone writes a leaf of 64
// floats.
void add_step(BackwardPlan& plan, int stream, Node* node, bool leaf, std::uint64_t seed) {
  const int i = static_cast<int>(plan.steps.size());
  BackwardPlan::Step st;
  st.stream = stream;
  st.node = node;
  plan.steps.push_back(st);
  if (!leaf) return;
  BackwardPlan::Buffer b;
  b.kind = BackwardPlan::BufferKind::kLeaf;
  b.leaf = randn({64}, seed);
  b.contributors = {i};
  b.first_use = b.last_use = i;
  plan.buffers.push_back(b);
}

BackwardPlan two_branch_plan(bool split_last_of_a) {
  BackwardPlan plan;
  plan.streams = {nullptr, nullptr};
  plan.side_of = {-1, -1};
  const int stream_of[] = {0, 1, 1, 1, 0, 0, 0};
  for (int i = 0; i < 7; ++i) {
    add_step(plan, stream_of[i], nullptr, true, 40 + static_cast<std::uint64_t>(i));
  }
  plan.waits.push_back({.producer = 0, .consumer = 1, .event = 0});
  plan.steps[1].waits = {0};
  plan.num_events = 1;
  if (split_last_of_a) {  // step 6's leaf gradient on side stream s2, which also waits for step 3
    plan.streams.push_back(nullptr);
    plan.side_of.push_back(0);
    plan.steps[6].side_stream = 2;
    plan.waits.push_back({.producer = 3, .consumer = 6, .event = 1, .consumer_side = true});
    plan.steps[6].side_waits = {1};
    plan.num_events = 2;
  }
  return plan;
}

TEST(GradBuckets, AcrossStreamsTheLeavesReadyTogetherGoTogether) {
  const BackwardPlan plan = two_branch_plan(false);
  // Estimated finish: step 0 at 1; B (s1) at 2, 3, 4; A (s0) at 2, 3, 4.
  const std::vector<GradBucket> one = plan_grad_buckets(plan, std::size_t{1} << 30);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].buffers, (std::vector<int>{0, 1, 4, 2, 5, 3, 6}));
  // Two leaves (512 bytes) a bucket, the first holding one: {0}, {1, 4}, {2, 5}, {3, 6} — each
  // pair one layer of each branch, waiting for both streams.
  const std::vector<GradBucket> pairs = plan_grad_buckets(plan, 512, 256);
  ASSERT_EQ(pairs.size(), 4u);
  const std::vector<std::vector<int>> expected = {{0}, {1, 4}, {2, 5}, {3, 6}};
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    EXPECT_EQ(pairs[k].buffers, expected[k]) << "bucket " << k;
    // Issued after its last step in plan order, never before the bucket before it.
    int last = -1;
    for (int b : pairs[k].buffers) last = std::max(last, plan.buffers[b].last_use);
    EXPECT_EQ(pairs[k].issue_after, last);
  }
  ASSERT_EQ(pairs[1].ready.size(), 2u);  // both streams' steps
  EXPECT_EQ(pairs[1].ready[0].step, 1);
  EXPECT_EQ(pairs[1].ready[1].step, 4);
  // Plan order would have been {0}, {1, 2}, {3, 4}, {5, 6}: B's first layer (step 3, finishing
  // last) bucketed with A's last (step 4).

  // One byte a bucket: each bucket is full at once and closes — but never between two leaves
  // ready together, which stay in one bucket (splitting them would start nothing earlier and add
  // a reduction): the same four buckets.
  const std::vector<GradBucket> tiny = plan_grad_buckets(plan, 1);
  ASSERT_EQ(tiny.size(), 4u);
  for (std::size_t k = 0; k < tiny.size(); ++k) {
    EXPECT_EQ(tiny[k].buffers, expected[k]) << "bucket " << k;
  }

  // Issue points never go back: a bucket of steps earlier in plan order than the bucket before
  // it is issued after that one. Split step 6, its side part waiting for step 3: 6's leaf is
  // ready at 5, after 3's (4), so 3 and 6 part: {0}, {1, 4}, {2, 5}, {3}, {6}.
  const BackwardPlan split = two_branch_plan(true);
  const std::vector<GradBucket> singles = plan_grad_buckets(split, 1);
  const std::vector<std::vector<int>> split_expected = {{0}, {1, 4}, {2, 5}, {3}, {6}};
  ASSERT_EQ(singles.size(), split_expected.size());
  for (std::size_t k = 0; k < singles.size(); ++k) {
    EXPECT_EQ(singles[k].buffers, split_expected[k]) << "bucket " << k;
  }
  ASSERT_EQ(singles[4].ready.size(), 1u);
  EXPECT_TRUE(singles[4].ready[0].side);
  // Bucket {3} comes after bucket {2, 5}: it is issued after step 5, not 3 — the issue points
  // are the running maximum of the buckets' last steps.
  int running = -1;
  for (const GradBucket& b : singles) {
    for (int i : b.buffers) running = std::max(running, plan.buffers[i].last_use);
    EXPECT_EQ(b.issue_after, running);
  }
  EXPECT_EQ(singles[3].issue_after, 5);
}

// K branches joined by adds, as the K-branch study sums them: on s0 the root's step (leaf 0),
// then for each of branches B (s1) and C (s2) an add that passes its gradient through to that
// branch, which takes two steps on its stream (its first waits for the add); then branch A's two
// steps on s0. Each branch step writes one leaf of 64 floats.
BackwardPlan summed_branches_plan(const std::shared_ptr<Node>& add) {
  BackwardPlan plan;
  plan.streams = {nullptr, nullptr, nullptr};
  plan.side_of = {-1, -1, -1};
  // step:           0  1(add) 2  3  4(add) 5  6  7  8
  const int stream_of[] = {0, 0, 1, 1, 0, 2, 2, 0, 0};
  for (int i = 0; i < 9; ++i) {
    const bool is_add = i == 1 || i == 4;
    add_step(plan, stream_of[i], is_add ? add.get() : nullptr, !is_add,
             60 + static_cast<std::uint64_t>(i));
  }
  plan.waits.push_back({.producer = 1, .consumer = 2, .event = 0});
  plan.waits.push_back({.producer = 4, .consumer = 5, .event = 1});
  plan.steps[2].waits = {0};
  plan.steps[5].waits = {1};
  plan.num_events = 2;
  return plan;
}

TEST(GradBuckets, AnAddThatPassesItsGradientThroughTakesNoTimeInTheEstimate) {
  // add of equal shapes passes its gradient through; add with a broadcast operand, and mul, do not.
  const Tensor a = randn({4, 6}, 1).set_requires_grad(true), b = randn({4, 6}, 2),
               row = randn({6}, 3);
  EXPECT_TRUE(add(a, b).grad_fn()->passes_gradient_through());
  EXPECT_FALSE(add(a, row).grad_fn()->passes_gradient_through());
  EXPECT_FALSE(mul(a, b).grad_fn()->passes_gradient_through());
  EXPECT_FALSE(sub(a, b).grad_fn()->passes_gradient_through());

  // Buffers: 0 the root's leaf, 1-2 branch B's layers, 3-4 C's, 5-6 A's. The adds take no time,
  // so every branch's first layer is done at 2 and its second at 3; one byte a bucket, a bucket
  // a layer of all three branches.
  const std::shared_ptr<Node> pass = add(a, b).grad_fn();
  const BackwardPlan plan = summed_branches_plan(pass);
  const std::vector<std::vector<int>> layers = {{0}, {1, 3, 5}, {2, 4, 6}};
  const std::vector<GradBucket> buckets = plan_grad_buckets(plan, 1);
  ASSERT_EQ(buckets.size(), layers.size());
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    EXPECT_EQ(buckets[k].buffers, layers[k]) << "bucket " << k;
  }
  ASSERT_EQ(buckets[1].ready.size(), 3u);  // each branch's first layer, on its own stream

  // Counted as a unit each (what the estimate did before), the adds stagger the branches — B
  // done at 3 and 4, C at 4 and 5, A at 4 and 5 — and a bucket mixes the layers of different
  // branches: {0}, {1}, {2, 3, 5}, {4, 6}, the third holding B's second layer with the first of
  // C and A.
  const std::shared_ptr<Node> plain = mul(a, b).grad_fn();
  const BackwardPlan staggered = summed_branches_plan(plain);
  const std::vector<std::vector<int>> mixed = {{0}, {1}, {2, 3, 5}, {4, 6}};
  const std::vector<GradBucket> old = plan_grad_buckets(staggered, 1);
  ASSERT_EQ(old.size(), mixed.size());
  for (std::size_t k = 0; k < old.size(); ++k) {
    EXPECT_EQ(old[k].buffers, mixed[k]) << "bucket " << k;
  }
}

TEST(GradientReduction, TheReducerGetsEveryLeafGradientOnceAfterItsLastWrite) {
  const Tensor x = randn({4, 6}, 9);
  Model reduced, plain;
  backward(plain.loss(x));
  for (std::size_t bytes : {std::size_t{1} << 30, std::size_t{100}, std::size_t{1}}) {
    for (const Tensor& p : reduced.params()) p.grad() = Tensor();
    RecordingReducer r(bytes);
    backward(reduced.loss(x), {.reduce_gradients = &r});
    ASSERT_EQ(r.layouts.size(), 1u);
    std::size_t handed = 0;
    for (const auto& b : r.buckets) handed += b.size();
    EXPECT_EQ(handed, 5u) << "bucket bytes " << bytes;
    for (std::size_t i = 0; i < 5; ++i) {
      const Tensor g = reduced.params()[i].grad();  // a handle: params() is a copy
      const std::vector<double> final_plain = values(plain.params()[i].grad());
      // Handed over final, and nothing wrote it after the reduction.
      EXPECT_EQ(r.seen.at(g.storage().get()), final_plain) << "parameter " << i;
      std::vector<double> half = final_plain;
      for (double& v : half) v *= 0.5;
      EXPECT_EQ(values(g), half) << "parameter " << i << ", bucket bytes " << bytes;
    }
    if (bytes == 1) {  // a bucket a step: a layer's weight and bias are final together
      EXPECT_EQ(r.buckets.size(), 3u);
    }
  }
}

// Note [Summed reductions]: sums a bucket with a second process holding the same gradients
// (doubles), asking the executor for gradients divided by two in a backward that overwrites.
class SummingReducer final : public GradientReducer {
 public:
  std::size_t bucket_bytes() const override { return 64; }
  cudaStream_t stream() const override { return nullptr; }
  void agree(std::uint64_t, const std::string&, bool) override {}
  double begin_backward(GradWrite grad_write) override {
    writes.push_back(grad_write);
    sum = grad_write == GradWrite::kOverwrite;
    return sum ? 0.5 : 1.0;
  }
  void reduce(const std::vector<Tensor>& grads) override {
    for (const Tensor& g : grads) {
      seen[g.storage().get()] = values(g);
      if (!sum) continue;  // averaging two equal gradients leaves them
      for (std::int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] *= 2;
    }
  }
  bool sum = false;
  std::vector<GradWrite> writes;
  std::map<const void*, std::vector<double>> seen;
};

TEST(GradientReduction, AReducerThatSumsGetsEveryGradientDividedThroughTheSeeds) {
  const Tensor x = randn({4, 6}, 9);
  Model summed, plain;
  backward(plain.loss(x));
  SummingReducer r;
  backward(summed.loss(x), {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &r});
  ASSERT_EQ(r.writes, std::vector<GradWrite>{GradWrite::kOverwrite});
  for (std::size_t i = 0; i < 5; ++i) {
    const Tensor g = summed.params()[i].grad();  // a handle: params() is a copy
    std::vector<double> half = values(plain.params()[i].grad());
    for (double& v : half) v *= 0.5;
    // Handed over divided by two (a power of two: exactly), summed back to the plain gradient.
    EXPECT_EQ(r.seen.at(g.storage().get()), half) << "parameter " << i;
    EXPECT_EQ(values(g), values(plain.params()[i].grad())) << "parameter " << i;
  }
  // A backward that accumulates keeps its seeds: the .grads hold earlier averages.
  backward(summed.loss(x), {.grad_write = GradWrite::kAccumulate, .reduce_gradients = &r});
  ASSERT_EQ(r.writes.size(), 2u);
  EXPECT_EQ(r.writes[1], GradWrite::kAccumulate);
  for (std::size_t i = 0; i < 5; ++i) {  // the earlier gradient plus this one, averaged (kept)
    const std::vector<double> once = values(plain.params()[i].grad()),
                              got = values(summed.params()[i].grad());
    ASSERT_EQ(got.size(), once.size());
    for (std::size_t j = 0; j < got.size(); ++j) {  // w1's two parts add in another order
      EXPECT_NEAR(got[j], 2 * once[j], 1e-5 * std::abs(once[j]) + 1e-6)
          << "parameter " << i << " element " << j;
    }
  }
}

TEST(GradientReduction, TheLayoutToAgreeOnFollowsTheModel) {
  Model a, b;
  RecordingReducer r(100);
  backward(a.loss(randn({4, 6}, 9)), {.reduce_gradients = &r});
  backward(b.loss(randn({8, 6}, 10)), {.reduce_gradients = &r});  // another batch: same layout
  ASSERT_EQ(r.layouts.size(), 2u);
  EXPECT_EQ(r.layouts[0], r.layouts[1]);
  EXPECT_NE(r.descriptions[0].find("5 gradients"), std::string::npos) << r.descriptions[0];
  b.w3 = randn({4, 6}, 5).set_requires_grad(true);  // another shape
  backward(b.loss(randn({8, 6}, 10)), {.reduce_gradients = &r});
  ASSERT_EQ(r.layouts.size(), 3u);
  EXPECT_NE(r.layouts[2], r.layouts[0]);
  // A BackwardGraph hands its reducer on (on the CPU it runs the eager backward).
  BackwardGraph bw(Device::cpu(), {.backward = {.reduce_gradients = &r}});
  bw.backward(a.loss(randn({4, 6}, 9)));
  ASSERT_EQ(r.layouts.size(), 4u);
  EXPECT_EQ(r.layouts[3], r.layouts[0]);
}

// A reducer that refuses the layout (the ranks disagree): the backward is refused before anything
// is written or released — the .grads as they were, the tape whole for another backward.
class RefusingReducer final : public GradientReducer {
 public:
  std::size_t bucket_bytes() const override { return 1 << 20; }
  cudaStream_t stream() const override { return nullptr; }
  void agree(std::uint64_t, const std::string& description, bool) override {
    throw Error("the ranks disagree: " + description);
  }
  void reduce(const std::vector<Tensor>&) override { ADD_FAILURE() << "reduce after a refusal"; }
};

TEST(GradientReduction, ALayoutTheRanksDisagreeOnWritesNothingAndKeepsTheTape) {
  Model m, plain;
  const Tensor x = randn({4, 6}, 9);
  backward(m.loss(x));
  const std::vector<double> before = values(m.w1.grad());
  const Tensor loss = m.loss(x);
  RefusingReducer refusing;
  GW_EXPECT_ERROR(backward(loss, {.reduce_gradients = &refusing}), "the ranks disagree",
                  "5 gradients");
  EXPECT_EQ(values(m.w1.grad()), before) << "a refused backward wrote a .grad";
  backward(loss);  // the tape was not released
  backward(plain.loss(x));
  backward(plain.loss(x));
  EXPECT_EQ(values(m.w1.grad()), values(plain.w1.grad()));
}

TEST(ProcessGroupCpu, AGroupOfOneChangesNothingAndBadGroupsAreRefusedByName) {
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = Device::cpu(), .bucket_bytes = 64});
  EXPECT_EQ(pg.rank(), 0);
  EXPECT_EQ(pg.world_size(), 1);
  const Tensor x = randn({4, 6}, 9);
  Model reduced, plain;
  backward(reduced.loss(x), {.reduce_gradients = &pg});
  backward(plain.loss(x));
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(values(reduced.params()[i].grad()), values(plain.params()[i].grad()));
  }
  pg.broadcast(reduced.params());
  pg.all_reduce_average(reduced.params());
  pg.check_identical(reduced.params(), "parameters");
  EXPECT_EQ(pg.all_gather(42), std::vector<std::uint64_t>{42});
  // A layout never agreed is refused inside a capture; once agreed, it passes there.
  GW_EXPECT_ERROR(pg.agree(7, "a layout", /*in_capture=*/true), "inside a capture",
                  "one backward of this model outside a capture");
  pg.agree(7, "a layout", false);
  pg.agree(7, "a layout", true);

  GW_EXPECT_ERROR(dist::ProcessGroup({.rank = 0, .world_size = 2, .device = Device::cpu()}),
                  "a group of 2 on the CPU");
  GW_EXPECT_ERROR(dist::ProcessGroup({.rank = 2, .world_size = 2, .device = Device::cpu()}),
                  "rank 2 of world size 2", "expected 0 <= rank < world size");
  GW_EXPECT_ERROR(dist::ProcessGroup({.world_size = 1, .device = Device::cpu(), .bucket_bytes = 0}),
                  "bucket_bytes is 0");
  GW_EXPECT_ERROR(pg.broadcast(reduced.params(), 1), "root 1", "below 1");
  // An undefined tensor is named as such (it was "a tensor on no device").
  GW_EXPECT_ERROR(pg.all_reduce_average({reduced.params()[0], Tensor()}), "tensor 1 of 2",
                  "undefined");
  GW_EXPECT_ERROR(pg.broadcast({Tensor()}), "tensor 0 of 1", "undefined");
  GW_EXPECT_ERROR(
      dist::ProcessGroup({.world_size = 1, .device = Device::cpu(), .collective_timeout_s = 0}),
      "collective_timeout_s is 0", "expected seconds above 0");
}

}  // namespace
}  // namespace graphward
