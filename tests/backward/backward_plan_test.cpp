// BackwardPlan of hand-built multistream tapes: nodes carry stream ids, nothing is launched (the
// streams are fake handles; planning makes no CUDA call). Pins the waits, forks and joins of
// rules [forward stream], [cross-stream gradients] and [fork and join] and the routing of gradient
// buffers.
#include <algorithm>

#include "test_util.h"

namespace graphward {
namespace {

cudaStream_t fake_stream(std::uintptr_t id) {
  return reinterpret_cast<cudaStream_t>(id * 0x1000);
}
const cudaStream_t kCaller = fake_stream(1);
const cudaStream_t kA = fake_stream(2);
const cudaStream_t kB = fake_stream(3);
constexpr Device kDev = Device::cuda(0);

InputMeta from(const std::shared_ptr<Node>& n) {
  return {n->output_shape(), DType::kFloat32, kDev, n->stream(), {n, Tensor()}};
}
InputMeta from_leaf(const Tensor& leaf) {
  return {leaf.shape(), DType::kFloat32, kDev, nullptr, {nullptr, leaf}};
}
std::shared_ptr<Node> node(const char* name, cudaStream_t s, std::vector<InputMeta> in) {
  return make_node(name, kDev, s, std::move(in), {4});
}
Tensor leaf() {
  return zeros({4}).set_requires_grad(true);
}

// A chain of `n` nodes on stream `s` starting from a leaf; returns the last node.
std::shared_ptr<Node> chain(cudaStream_t s, int n, const Tensor& l) {
  std::shared_ptr<Node> cur = node("first", s, {from_leaf(l)});
  for (int i = 1; i < n; ++i) cur = node("layer", s, {from(cur)});
  return cur;
}

int count_waits_between(const BackwardPlan& p, int producer_stream, int consumer_stream) {
  int n = 0;
  for (const auto& w : p.waits) {
    n += p.steps[w.producer].stream == producer_stream &&
         p.steps[w.consumer].stream == consumer_stream;
  }
  return n;
}

TEST(BackwardPlan, SingleStreamTapeOnTheCallersStreamHasNoWaitsForksOrJoins) {
  const Tensor w = leaf();
  const auto root = chain(kCaller, 5, w);
  const BackwardPlan p = plan_backward({{root, {}}}, kCaller);
  EXPECT_EQ(p.steps.size(), 5u);
  EXPECT_EQ(p.streams.size(), 1u);
  EXPECT_TRUE(p.waits.empty());
  EXPECT_TRUE(p.forks.empty());
  EXPECT_TRUE(p.joins.empty());
  EXPECT_EQ(p.steps.front().node, root.get()) << "the root runs first";
  for (std::size_t i = 1; i < p.steps.size(); ++i) {
    EXPECT_LT(p.steps[i].node->sequence_nr(), p.steps[i - 1].node->sequence_nr());
  }
}

TEST(BackwardPlan, SingleStreamTapeOnAnotherStreamForksAndJoinsItOnce) {
  const Tensor w = leaf();
  const BackwardPlan p = plan_backward({{chain(kA, 4, w), {}}}, kCaller);
  EXPECT_TRUE(p.waits.empty());
  ASSERT_EQ(p.forks.size(), 1u);
  ASSERT_EQ(p.joins.size(), 1u);
  EXPECT_EQ(p.streams[p.forks[0]], kA);
  EXPECT_EQ(p.streams[p.joins[0]], kA);
}

TEST(BackwardPlan, TwoIndependentBranchesOnTwoStreamsForkAndJoinEachOnceWithNoWaitBetween) {
  const Tensor wa = leaf(), wb = leaf();
  const auto ra = chain(kA, 8, wa), rb = chain(kB, 8, wb);
  const BackwardPlan p = plan_backward({{ra, {}}, {rb, {}}}, kCaller);
  EXPECT_EQ(p.steps.size(), 16u);
  EXPECT_TRUE(p.waits.empty()) << p.dump();
  EXPECT_EQ(p.forks.size(), 2u);
  EXPECT_EQ(p.joins.size(), 2u);
  for (const auto& s : p.steps) {
    EXPECT_EQ(p.streams[s.stream], s.node->stream())
        << "rule [forward stream]: backward on the forward's stream";
  }
}

TEST(BackwardPlan, BranchesJoinedByALossOnTheCallerWaitOnlyForTheLoss) {
  const Tensor wa = leaf(), wb = leaf();
  const auto ra = chain(kA, 8, wa), rb = chain(kB, 8, wb);
  const auto loss = node("loss", kCaller, {from(ra), from(rb)});
  const BackwardPlan p = plan_backward({{loss, {}}}, kCaller);
  EXPECT_EQ(p.waits.size(), 2u) << p.dump();
  EXPECT_EQ(
      count_waits_between(p, 0, p.steps[1].stream) + count_waits_between(p, 0, p.steps[2].stream),
      2);
  const int a = p.steps[p.waits[0].consumer].stream, b = p.steps[p.waits[1].consumer].stream;
  EXPECT_NE(a, b);
  EXPECT_EQ(count_waits_between(p, a, b) + count_waits_between(p, b, a), 0)
      << "no wait between branches";
  EXPECT_TRUE(p.forks.empty()) << "each branch first waits for the loss on the caller's stream";
  EXPECT_EQ(p.joins.size(), 2u);
}

TEST(BackwardPlan, ACrossStreamUseHasExactlyOneWait) {
  const Tensor w = leaf();
  const auto x = chain(kA, 3, w);                  // produced on A
  const auto y = node("consumer", kB, {from(x)});  // consumed on B
  const BackwardPlan p = plan_backward({{y, {}}}, kB);
  ASSERT_EQ(p.waits.size(), 1u) << p.dump();
  EXPECT_EQ(p.steps[p.waits[0].producer].node, y.get());
  EXPECT_EQ(p.steps[p.waits[0].consumer].node, x.get());
  EXPECT_EQ(p.steps[p.waits[0].producer].event, p.waits[0].event);
  EXPECT_TRUE(p.forks.empty()) << "A's first step waits for the caller's stream (B)";
  EXPECT_EQ(p.joins, std::vector<int>{1});
}

TEST(BackwardPlan, AStreamWaitsOnceForSeveralContributionsFromAnotherStream) {
  const Tensor w = leaf();
  const auto x = node("x", kA, {from_leaf(w)});
  const auto y1 = node("y1", kB, {from(x)});
  const auto y2 = node("y2", kB, {from(x)});
  const auto root = node("root", kB, {from(y1), from(y2)});
  const BackwardPlan p = plan_backward({{root, {}}}, kB);
  EXPECT_EQ(p.waits.size(), 1u) << "the later contribution covers the earlier one\n" << p.dump();
  // Both contributions come from another stream: each is staged and added on x's stream.
  const auto& xs = p.steps.back();
  EXPECT_EQ(xs.node, x.get());
  EXPECT_EQ(xs.staged.size(), 2u);
}

TEST(BackwardPlan, ContributionsOnTheOwnersStreamAreWrittenInPlace) {
  const Tensor w = leaf();
  const auto x = node("x", kA, {from_leaf(w)});
  const auto y1 = node("y1", kA, {from(x)});
  const auto y2 = node("y2", kA, {from(x)});
  const auto root = node("root", kA, {from(y1), from(y2)});
  const BackwardPlan p = plan_backward({{root, {}}}, kA);
  const auto& xs = p.steps.back();
  EXPECT_TRUE(xs.staged.empty());
  // y2 runs before y1 (later sequence number first): it writes, y1 adds.
  EXPECT_EQ(p.steps[1].node, y2.get());
  EXPECT_EQ(p.steps[1].writes[0].buffer, xs.grad_buffer);
  EXPECT_FALSE(p.steps[1].writes[0].accumulate);
  EXPECT_TRUE(p.steps[2].writes[0].accumulate);
}

TEST(BackwardPlan, ALeafWrittenFromTwoStreamsIsSerializedByOneWait) {
  const Tensor w = leaf();
  const auto a = node("a", kA, {from_leaf(w)});
  const auto b = node("b", kB, {from_leaf(w)});
  const BackwardPlan p = plan_backward({{a, {}}, {b, {}}}, kCaller, GradWrite::kOverwrite);
  ASSERT_EQ(p.waits.size(), 1u) << p.dump();
  // b (created later) runs first and overwrites; a waits for it, then adds.
  EXPECT_EQ(p.steps[0].node, b.get());
  EXPECT_FALSE(p.steps[0].writes[0].accumulate);
  EXPECT_TRUE(p.steps[1].writes[0].accumulate);
  EXPECT_EQ(p.waits[0].producer, 0);
  EXPECT_EQ(p.waits[0].consumer, 1);
}

TEST(BackwardPlan, SeedsRootsAndBufferLifetimes) {
  const Tensor w = leaf();
  const auto x = node("x", kA, {from_leaf(w)});
  const auto y = node("y", kA, {from(x)});
  // x is both a root and an input of the root y: its buffer gets a seed and y's contribution.
  const BackwardPlan p = plan_backward({{y, {}}, {x, {}}}, kA);
  ASSERT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.root_steps, (std::vector<int>{0, 1}));
  const auto& xb = p.buffers[p.steps[1].grad_buffer];
  EXPECT_EQ(xb.contributors, (std::vector<int>{BackwardPlan::kSeed, 0}));
  EXPECT_EQ(p.steps[1].seeds, std::vector<int>{1});
  EXPECT_EQ(xb.last_use, 1);
  const std::string dump = p.dump();
  EXPECT_NE(dump.find("step 0: y#"), std::string::npos) << dump;
  EXPECT_NE(dump.find("seed"), std::string::npos) << dump;
}

TEST(BackwardPlan, RefusesGraphsItCannotRun) {
  const auto on_cpu = make_node("cpu_node", Device::cpu(), nullptr, {}, {4});
  const auto on_gpu = node("gpu_node", kA, {from(on_cpu)});
  GW_EXPECT_ERROR(plan_backward({{on_gpu, {}}}, kA), "spans devices", "cpu_node#");
  const auto released = node("freed", kA, {});
  released->release_saved();
  GW_EXPECT_ERROR(plan_backward({{released, {}}}, kA), "freed#", "a second time");
}

// ---- weight-gradient parallelism (PlanOptions::split_weight_grads) ------------------------------

// A layer: a node with the previous layer's node and a leaf (its weight) as inputs.
std::shared_ptr<Node> layer(cudaStream_t s, const std::shared_ptr<Node>& prev, const Tensor& w) {
  return node("layer", s, {from(prev), from_leaf(w)});
}

TEST(BackwardPlanSplit, LeafGradientsOfCriticalPathLayersMoveToOneSideStreamPerForwardStream) {
  const Tensor w0 = leaf(), w1 = leaf(), w2 = leaf(), w3 = leaf();
  const auto l0 = node("first", kA, {from_leaf(w0)});  // no node input: stays whole
  const auto l1 = layer(kA, l0, w1), l2 = layer(kA, l1, w2), l3 = layer(kA, l2, w3);
  const BackwardPlan plain = plan_backward({{l3, {}}}, kCaller);
  const BackwardPlan p =
      plan_backward({{l3, {}}}, kCaller, GradWrite::kAccumulate, {.split_weight_grads = true});
  SCOPED_TRACE(p.dump());
  ASSERT_EQ(p.steps.size(), 4u);
  ASSERT_EQ(p.streams.size(), 3u);  // caller, A, A's side stream
  EXPECT_EQ(p.streams[2], nullptr) << "the executor supplies side streams";
  EXPECT_EQ(p.side_of, (std::vector<int>{-1, -1, 1}));
  EXPECT_EQ(p.forks, (std::vector<int>{1})) << "a side stream starts inside a step";
  EXPECT_EQ(p.joins, (std::vector<int>{1, 2}));
  for (const auto& st : p.steps) {
    if (st.node == l0.get()) {
      EXPECT_EQ(st.side_stream, -1);
    } else {
      EXPECT_EQ(st.side_stream, 2);
      EXPECT_GE(st.side_fork_event, 0);
      EXPECT_TRUE(st.side_waits.empty()) << "each weight is written once";
    }
  }
  // The rest of the plan is unchanged: same order, same waits.
  EXPECT_EQ(p.waits.size(), plain.waits.size());
  EXPECT_EQ(plain.streams.size(), 2u);
  EXPECT_TRUE(plain.side_of == std::vector<int>({-1, -1}));
}

TEST(BackwardPlanSplit, AWeightSharedWithALayerOnTheMainStreamIsWrittenInOrder) {
  // w is used by a split layer (its gradient goes to the side stream) and by the first layer
  // (written on A itself, later in the backward): the first layer must wait for the side part.
  const Tensor w = leaf(), w1 = leaf();
  const auto l0 = node("first", kA, {from_leaf(w)});
  const auto l1 = layer(kA, l0, w);
  const auto l2 = layer(kA, l1, w1);
  const BackwardPlan p =
      plan_backward({{l2, {}}}, kCaller, GradWrite::kAccumulate, {.split_weight_grads = true});
  SCOPED_TRACE(p.dump());
  int first = -1, split = -1;
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    if (p.steps[i].node == l0.get()) first = static_cast<int>(i);
    if (p.steps[i].node == l1.get()) split = static_cast<int>(i);
  }
  ASSERT_GE(first, 0);
  ASSERT_GE(split, 0);
  ASSERT_GE(p.steps[split].side_event, 0) << "someone waits for the side part";
  bool waited = false;
  for (int wi : p.steps[first].waits) {
    const auto& wt = p.waits[wi];
    waited = waited ||
             (wt.producer == split && wt.producer_side && wt.event == p.steps[split].side_event);
  }
  EXPECT_TRUE(waited) << "the first layer writes w after the side part of layer 1 did";
}

// ---- Note [Streams of an eager backward] -------------------------------------------------------

// Two branches on A and B from one leaf each, x feeding both, summed by a loss on `loss_stream`:
// x's gradient has a contribution from each branch (staged on x's stream).
struct Diamond {
  Tensor w = leaf(), wa = leaf(), wb = leaf();
  std::shared_ptr<Node> x, a, b, loss;
  explicit Diamond(cudaStream_t loss_stream) {
    x = node("x", kCaller, {from_leaf(w)});
    a = node("a", kA, {from(x), from_leaf(wa)});
    b = node("b", kB, {from(x), from_leaf(wb)});
    loss = node("loss", loss_stream, {from(a), from(b)});
  }
};

TEST(EagerStreams, MovingEveryStepToTheCallersStreamKeepsTheBuffersAndDropsTheSynchronization) {
  const Diamond d(kCaller);
  const BackwardPlan planned = plan_backward({{d.loss, {}}}, kCaller);
  ASSERT_EQ(planned.streams.size(), 3u) << planned.dump();
  ASSERT_FALSE(planned.waits.empty());
  BackwardPlan p = planned;
  run_on_caller_stream(p);
  SCOPED_TRACE(p.dump());
  EXPECT_EQ(p.streams, std::vector<cudaStream_t>{kCaller});
  EXPECT_EQ(p.moved_streams.size(), 2u);
  EXPECT_TRUE(p.caller_waits.empty()) << "the root was made on the caller's stream";
  EXPECT_TRUE(p.waits.empty());
  EXPECT_TRUE(p.forks.empty());
  EXPECT_TRUE(p.joins.empty());
  ASSERT_EQ(p.steps.size(), planned.steps.size());
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const auto& got = p.steps[i];
    const auto& was = planned.steps[i];
    EXPECT_EQ(got.stream, 0);
    EXPECT_TRUE(got.waits.empty());
    EXPECT_EQ(got.event, -1);
    // The same steps in the same order, and the same routing: contributions are added in the
    // multistream plan's order (the gradients stay bitwise the same).
    EXPECT_EQ(got.node, was.node);
    EXPECT_EQ(got.grad_buffer, was.grad_buffer);
    EXPECT_EQ(got.staged, was.staged);
    EXPECT_EQ(got.seeds, was.seeds);
    ASSERT_EQ(got.writes.size(), was.writes.size());
    for (std::size_t w = 0; w < got.writes.size(); ++w) {
      EXPECT_EQ(got.writes[w].buffer, was.writes[w].buffer);
      EXPECT_EQ(got.writes[w].accumulate, was.writes[w].accumulate);
    }
  }
  ASSERT_EQ(p.buffers.size(), planned.buffers.size());
  int staged = 0;
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    EXPECT_EQ(p.buffers[b].kind, planned.buffers[b].kind);
    EXPECT_EQ(p.buffers[b].contributors, planned.buffers[b].contributors);
    EXPECT_EQ(p.buffers[b].stream, 0);
    staged += p.buffers[b].kind == BackwardPlan::BufferKind::kStaged;
  }
  EXPECT_GT(staged, 0) << "x's contributions from A and B stay staged";
}

TEST(EagerStreams, TheCallersStreamWaitsForARootMadeOnAnotherStream) {
  const Diamond d(kB);  // the loss on B, the backward called on the caller's stream
  BackwardPlan p = plan_backward({{d.loss, {}}}, kCaller);
  run_on_caller_stream(p);
  EXPECT_EQ(p.caller_waits, std::vector<cudaStream_t>{kB}) << p.dump();
  // Two roots on A and one on B: each stream once.
  const Tensor w = leaf();
  const auto r1 = chain(kA, 2, w), r2 = chain(kA, 2, w), r3 = chain(kB, 2, w);
  BackwardPlan q = plan_backward({{r1, {}}, {r2, {}}, {r3, {}}}, kCaller);
  run_on_caller_stream(q);
  std::vector<cudaStream_t> waits = q.caller_waits;
  std::sort(waits.begin(), waits.end());
  std::vector<cudaStream_t> want{kA, kB};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(waits, want) << q.dump();
}

TEST(EagerStreams, TheEstimateCountsBackwardFlopsAndBytesAgainstTheHostFloor) {
  const Diamond d(kCaller);
  const BackwardPlan p = plan_backward({{d.loss, {}}}, kCaller);
  const DeviceThroughput rate{.flops_per_us = 1e6, .bytes_per_us = 1e3};
  // Nodes of 4 float32 elements: output 16 B, inputs 16 B each, nothing saved.
  double bytes = 0;
  for (const auto& st : p.steps) bytes += 16.0 * (1 + st.node->inputs().size());
  EXPECT_DOUBLE_EQ(estimate_device_us(p, rate), bytes / 1e3);
  EXPECT_TRUE(host_bound(p, rate));
  // A matrix product's worth of work on one node makes the GPU the bottleneck.
  const double floor_us = kHostFloorUs * static_cast<double>(p.steps.size());
  d.a->set_backward_flops(floor_us * 1e6);
  EXPECT_NEAR(estimate_device_us(p, rate), floor_us + bytes / 1e3, 1e-9);
  EXPECT_FALSE(host_bound(p, rate));
  d.a->set_backward_flops(0.5 * floor_us * 1e6);
  EXPECT_TRUE(host_bound(p, rate));
  // Unknown rates: no estimate, the streams stay.
  EXPECT_LT(estimate_device_us(p, {}), 0);
  EXPECT_FALSE(host_bound(p, {}));
  // One stream: nothing to move.
  const Tensor w = leaf();
  EXPECT_FALSE(host_bound(plan_backward({{chain(kCaller, 3, w), {}}}, kCaller), rate));
}

TEST(EagerStreams, APlanWithSideStreamsKeepsThem) {
  const Diamond d(kCaller);
  const BackwardPlan p =
      plan_backward({{d.loss, {}}}, kCaller, GradWrite::kAccumulate, {.split_weight_grads = true});
  bool side = false;
  for (int s : p.side_of) side = side || s >= 0;
  ASSERT_TRUE(side) << p.dump();
  EXPECT_FALSE(host_bound(p, {.flops_per_us = 1e6, .bytes_per_us = 1e6}));
  BackwardPlan q = p;
  GW_EXPECT_ERROR(run_on_caller_stream(q), "side streams");
}

// A plan's dump ends with its program (Note [The backward program]): here a chain on another
// stream, forked from the caller's, its steps, then its join.
TEST(BackwardProgram, APlansDumpEndsWithTheProgramItRuns) {
  const Tensor w = leaf();
  const BackwardPlan p = plan_backward({{chain(kA, 2, w), {}}}, kCaller);
  const std::string d = p.dump();
  const std::size_t program = d.find("BackwardProgram: ");
  ASSERT_NE(program, std::string::npos) << d;
  const std::string expected_order[] = {"record on s0 e",  "wait on s1 e", "gather on s1 step 0",
                                        "run on s1 step 0", "drop on s1 step 1", "-- join",
                                        "record on s1 e",   "wait on s0 e"};
  std::size_t at = program;
  for (const std::string& line : expected_order) {
    const std::size_t next = d.find(line, at);
    ASSERT_NE(next, std::string::npos) << "no \"" << line << "\" after the last match\n" << d;
    at = next + line.size();
  }
}

}  // namespace
}  // namespace graphward
