// Tape signatures and the graph cache's policy, on the CPU: equal for equal tapes; for every kind
// of change a graph cannot survive (a shape, a dtype, a new branch, the stream structure, the
// gradient mode, a .grad appearing) a different structure; for a replaced parameter or gradient the
// same structure with other addresses; and a readable reason for each. Hand-built tapes carry fake
// stream handles: nothing is launched.
#include "graphward/capture/graph_cache.h"
#include "graphward/capture/signature.h"
#include "graphward/engine/runtime/math_mode.h"
#include "graphward/engine/tape/host_state.h"
#include "graphward/engine/tape/tape_log.h"
#include "test_util.h"

#include <algorithm>
#include <functional>

namespace graphward::capture {
namespace {

cudaStream_t fake_stream(std::uintptr_t id) {
  return reinterpret_cast<cudaStream_t>(id * 0x1000);
}

// A model of two branches (linear + relu) summed, mse loss; CPU tensors.
struct Model {
  Tensor w0, b0, w1, b1, target;
  explicit Model(std::int64_t width = 6) {
    w0 = randn({width, width}, 1).set_requires_grad(true);
    b0 = randn({width}, 2).set_requires_grad(true);
    w1 = randn({width, width}, 3).set_requires_grad(true);
    b1 = randn({width}, 4).set_requires_grad(true);
    target = randn({5, width}, 5);
  }
  Tensor loss(const Tensor& x, bool tanh_branch = false) const {
    const Tensor h0 = relu(linear(x, w0, b0));
    const Tensor h1 = tanh_branch ? tanh(linear(x, w1, b1)) : relu(linear(x, w1, b1));
    return mse_loss(add(h0, h1), target);
  }
};

TapeSignature sig(const Tensor& loss, GradWrite mode = GradWrite::kAccumulate) {
  return tape_signature({loss}, {}, nullptr, mode);
}

TEST(TapeSignature, EqualForTheSameTapeAndForTheSameModelAgain) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  const Tensor loss = m.loss(x);
  const TapeSignature a = sig(loss), b = sig(loss);
  EXPECT_TRUE(a.same_structure(b));
  EXPECT_TRUE(a.same_addresses(b));
  EXPECT_EQ(describe_difference(a, b), "");
  EXPECT_EQ(a.num_nodes(), 6);  // mse_loss, add, and relu + linear per branch
  // Another forward of the same model: the same structure; its activations are new memory.
  const TapeSignature c = sig(m.loss(x));
  EXPECT_TRUE(a.same_structure(c));
  EXPECT_FALSE(a.same_addresses(c));
  EXPECT_NE(describe_difference(a, c).find("addresses changed"), std::string::npos)
      << describe_difference(a, c);
}

// A walk keeps nothing of the tape it walked: once the model, its tape and the signature are gone,
// so is the parameters' memory (the walker is per thread and lives as long as the thread).
TEST(TapeSignature, NothingOfAWalkedModelOutlivesTheModelAndTheSignature) {
  std::weak_ptr<Storage> w0, b1;
  {
    Model m;
    w0 = m.w0.storage();
    b1 = m.b1.storage();
    const TapeSignature s = sig(m.loss(randn({5, 6}, 10)));
    EXPECT_EQ(s.source, TapeSignature::Source::kWalk);
    EXPECT_FALSE(w0.expired());
  }
  EXPECT_TRUE(w0.expired()) << "a parameter's storage is still held after its model is gone";
  EXPECT_TRUE(b1.expired()) << "a parameter's storage is still held after its model is gone";
}

TEST(TapeSignature, AShapeChangeIsANewStructureAndTheReasonSaysWhere) {
  Model m;
  const TapeSignature a = sig(m.loss(randn({5, 6}, 10)));
  Model m2;
  m2.target = randn({3, 6}, 5);
  const TapeSignature b = sig(m2.loss(randn({3, 6}, 10)));
  EXPECT_FALSE(a.same_structure(b));
  const std::string why = describe_difference(a, b);
  EXPECT_NE(why.find("node 0"), std::string::npos) << why;
  EXPECT_NE(why.find("[5, 6]"), std::string::npos) << why;
  EXPECT_NE(why.find("[3, 6]"), std::string::npos) << why;
}

TEST(TapeSignature, ANewBranchOrADifferentOpIsANewStructure) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  const TapeSignature relu_tape = sig(m.loss(x)), tanh_tape = sig(m.loss(x, true));
  EXPECT_FALSE(relu_tape.same_structure(tanh_tape));
  const std::string why = describe_difference(relu_tape, tanh_tape);
  EXPECT_NE(why.find("relu"), std::string::npos) << why;
  EXPECT_NE(why.find("tanh"), std::string::npos) << why;
  // An extra node.
  const TapeSignature longer = sig(mul(m.loss(x), 2.0));
  EXPECT_FALSE(relu_tape.same_structure(longer));
  EXPECT_NE(describe_difference(relu_tape, longer).find("nodes"), std::string::npos);
}

TEST(TapeSignature, DtypeGradModeAndAGradAppearingChangeTheStructure) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  const Tensor loss = m.loss(x);
  const TapeSignature a = sig(loss);
  EXPECT_FALSE(a.same_structure(sig(loss, GradWrite::kOverwrite)));
  // float64 model
  Model d;
  const auto f64 = [](const Tensor& t) {
    const std::vector<float> v = t.to_vector<float>();
    return from_vector(std::vector<double>(v.begin(), v.end()), t.shape());
  };
  d.w0 = f64(m.w0).set_requires_grad(true);
  d.b0 = f64(m.b0).set_requires_grad(true);
  d.w1 = f64(m.w1).set_requires_grad(true);
  d.b1 = f64(m.b1).set_requires_grad(true);
  d.target = f64(m.target);
  EXPECT_FALSE(a.same_structure(sig(d.loss(f64(x)))));
  // A leaf's .grad now exists (the backward will accumulate into it, not allocate it).
  backward(loss, {.retain_graph = true});
  EXPECT_FALSE(a.same_structure(sig(loss)));
}

// Note [TF32]: each switch is part of the structure (a captured backward replays the kernels it
// chose), with a reason that names the switches; a whole step's host-state log notes them too.
TEST(TapeSignature, EachTf32SwitchChangesTheStructureWithAReasonAndTheStepLogSeesIt) {
  const bool matmul = matmul_tf32(), conv = conv_tf32();
  ASSERT_FALSE(matmul || conv) << "both switches are off by default";
  Model m;
  const Tensor loss = m.loss(randn({5, 6}, 10));
  const TapeSignature off = sig(loss);
  HostStateLog log;
  {
    HostStateScope scope(log);  // as a StepGraph's capture begins
  }
  EXPECT_EQ(log.change(), "");
  for (const bool on_matmul : {true, false}) {
    set_matmul_tf32(on_matmul);
    set_conv_tf32(!on_matmul);
    const TapeSignature now = sig(loss);
    EXPECT_FALSE(off.same_structure(now)) << "matmul " << on_matmul;
    const std::string why = describe_difference(off, now);
    EXPECT_NE(why.find("TF32"), std::string::npos) << why;
    EXPECT_NE(log.change().find("the TF32 switches changed"), std::string::npos) << log.change();
  }
  set_matmul_tf32(false);
  set_conv_tf32(false);
  EXPECT_TRUE(off.same_structure(sig(loss))) << "switched back: the structure captured first";
  EXPECT_EQ(log.change(), "");
  EXPECT_STREQ(detail::math_mode_str(3), "TF32 on for matmul and conv");
  EXPECT_STREQ(detail::math_mode_str(0), "TF32 off for matmul and conv");
}

TEST(TapeSignature, AReplacedParameterOrGradientKeepsTheStructureAndChangesAnAddress) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  Tensor loss = m.loss(x);
  backward(loss, {.retain_graph = true});  // .grad exists from now on
  const TapeSignature before = sig(loss);
  // The same tape, one gradient buffer replaced.
  m.w1.grad() = zeros(m.w1.shape());
  const TapeSignature grad_moved = sig(loss);
  EXPECT_TRUE(before.same_structure(grad_moved));
  EXPECT_FALSE(before.same_addresses(grad_moved));
  std::string why = describe_difference(before, grad_moved);
  EXPECT_NE(why.find("1 of"), std::string::npos) << why;
  EXPECT_NE(why.find(".grad of leaf"), std::string::npos) << why;
  // A parameter reallocated (same shape): a new forward saves the new storage.
  const Tensor old_w0 = m.w0;
  m.w0 = randn(m.w0.shape(), 99).set_requires_grad(true);
  m.w0.grad() = old_w0.grad();
  const TapeSignature param_moved = sig(m.loss(x));
  EXPECT_TRUE(before.same_structure(param_moved));
  EXPECT_FALSE(before.same_addresses(param_moved));
}

// ---- hand-built multistream tapes ---------------------------------------------------------------

InputMeta from(const std::shared_ptr<Node>& n) {
  return {n->output_shape(), DType::kFloat32, Device::cuda(0), n->stream(), {n, Tensor()}};
}
InputMeta from_leaf(const Tensor& leaf, cudaStream_t s) {
  return {leaf.shape(), DType::kFloat32, Device::cuda(0), s, {nullptr, leaf}};
}
// Two branches on streams sa and sb, joined on the caller's stream.
Tensor two_stream_tape(cudaStream_t caller, cudaStream_t sa, cudaStream_t sb, const Tensor& la,
                       const Tensor& lb) {
  const auto a = make_node("layer", Device::cuda(0), sa, {from_leaf(la, sa)}, {4});
  const auto b = make_node("layer", Device::cuda(0), sb, {from_leaf(lb, sb)}, {4});
  const auto join = make_node("add", Device::cuda(0), caller, {from(a), from(b)}, {4});
  const Tensor root = zeros({1});
  root.set_grad_fn(join);
  return root;
}

TEST(TapeSignature, StreamsAreNumberedSoTheSameStructureOnOtherStreamsMatches) {
  const Tensor la = zeros({4}).set_requires_grad(true), lb = zeros({4}).set_requires_grad(true);
  const cudaStream_t caller = fake_stream(1);
  const Tensor t1 = two_stream_tape(caller, fake_stream(2), fake_stream(3), la, lb);
  const Tensor t2 = two_stream_tape(caller, fake_stream(7), fake_stream(8), la, lb);
  const Tensor same_stream = two_stream_tape(caller, fake_stream(2), fake_stream(2), la, lb);
  const Tensor on_caller = two_stream_tape(caller, caller, fake_stream(3), la, lb);
  const auto s1 = tape_signature({t1}, {zeros({1})}, caller, GradWrite::kAccumulate);
  const auto s2 = tape_signature({t2}, {zeros({1})}, caller, GradWrite::kAccumulate);
  EXPECT_TRUE(s1.same_structure(s2)) << describe_difference(s1, s2);
  const auto s3 = tape_signature({same_stream}, {zeros({1})}, caller, GradWrite::kAccumulate);
  EXPECT_FALSE(s1.same_structure(s3));
  const std::string why = describe_difference(s1, s3);
  EXPECT_NE(why.find("on s"), std::string::npos) << why;
  const auto s4 = tape_signature({on_caller}, {zeros({1})}, caller, GradWrite::kAccumulate);
  EXPECT_FALSE(s1.same_structure(s4));
  // The node record reads back.
  EXPECT_EQ(s1.describe_node(0),
            "add on s0 -> [4] (in0: node 1 float32 from s1; in1: node 2 float32 from s2)");
  // A seed of another shape is another structure.
  const auto s5 = tape_signature({t1}, {zeros({2})}, caller, GradWrite::kAccumulate);
  EXPECT_FALSE(s1.same_structure(s5));
}

TEST(TapeSignature, AReleasedGraphIsRefusedAsBackwardWouldRefuseIt) {
  Model m;
  const Tensor loss = m.loss(randn({5, 6}, 10));
  backward(loss);
  GW_EXPECT_ERROR(sig(loss), "a second time", "retain_graph");
}

// ---- signatures from the tape log (Note [Tape log])
// ------------------------------------------------

// Arms this thread's tape log for the test (as a BackwardGraph does) and starts a step.
struct ArmedLog {
  ArmedLog() { detail::tape_log_arm(); }
  ~ArmedLog() { detail::tape_log_disarm(); }
  void new_step() const { detail::tape_log_reset(); }
};

TEST(TapeLog, EqualStepsGiveEqualSignaturesFromTheLogWithoutAWalk) {
  ArmedLog log;
  Model m;
  const Tensor x = randn({5, 6}, 10);
  log.new_step();
  const Tensor loss1 = m.loss(x);
  const TapeSignature a = sig(loss1);
  EXPECT_EQ(a.source, TapeSignature::Source::kLog) << (a.walk_reason ? a.walk_reason : "");
  EXPECT_EQ(a.num_nodes(), 6);
  EXPECT_EQ(a.leaves.size(), 4u);
  log.new_step();
  const Tensor loss2 = m.loss(x);
  const TapeSignature b = sig(loss2);
  ASSERT_EQ(b.source, TapeSignature::Source::kLog);
  EXPECT_TRUE(a.same_structure(b)) << describe_difference(a, b);
  EXPECT_FALSE(a.same_addresses(b));  // new activations
  EXPECT_NE(describe_difference(a, b).find("addresses changed"), std::string::npos);
  // A walk of the same tape is the other kind of signature: never equal to a log's.
  TapeSignature walked;
  tape_signature_walk(walked, {loss2}, {}, nullptr, GradWrite::kAccumulate);
  EXPECT_EQ(walked.source, TapeSignature::Source::kWalk);
  EXPECT_FALSE(walked.same_structure(b));
  EXPECT_NE(describe_difference(b, walked).find("tape log"), std::string::npos)
      << describe_difference(b, walked);
  // Both list the same nodes, in their own orders.
  std::vector<Node*> x1 = walked.nodes, x2 = b.nodes;
  std::sort(x1.begin(), x1.end());
  std::sort(x2.begin(), x2.end());
  EXPECT_EQ(x1, x2);
}

TEST(TapeLog, EveryKindOfChangeIsANewStructure) {
  ArmedLog log;
  Model m;
  const Tensor x = randn({5, 6}, 10);
  auto step = [&](const std::function<Tensor()>& forward, GradWrite mode = GradWrite::kAccumulate) {
    log.new_step();
    const Tensor loss = forward();
    TapeSignature s = sig(loss, mode);
    EXPECT_EQ(s.source, TapeSignature::Source::kLog) << (s.walk_reason ? s.walk_reason : "");
    return s;
  };
  const TapeSignature base = step([&] { return m.loss(x); });
  const TapeSignature tanh_branch = step([&] { return m.loss(x, true); });
  EXPECT_FALSE(base.same_structure(tanh_branch));
  const std::string why = describe_difference(base, tanh_branch);
  EXPECT_NE(why.find("tanh"), std::string::npos) << why;
  EXPECT_FALSE(base.same_structure(step([&] { return m.loss(x); }, GradWrite::kOverwrite)));
  Model m3;
  m3.target = randn({3, 6}, 5);
  EXPECT_FALSE(base.same_structure(step([&] { return m3.loss(randn({3, 6}, 11)); })));
  EXPECT_FALSE(base.same_structure(step([&] { return mul(m.loss(x), 2.0); })));
  // The same model on another stream structure: nodes on two "streams" of a hand-built tape.
  const Tensor la = zeros({4}).set_requires_grad(true), lb = zeros({4}).set_requires_grad(true);
  const cudaStream_t caller = fake_stream(1);
  log.new_step();
  const Tensor t1 = two_stream_tape(caller, fake_stream(2), fake_stream(3), la, lb);
  const auto s1 = tape_signature({t1}, {zeros({1})}, caller, GradWrite::kAccumulate);
  log.new_step();
  const Tensor t2 = two_stream_tape(caller, fake_stream(2), fake_stream(2), la, lb);
  const auto s2 = tape_signature({t2}, {zeros({1})}, caller, GradWrite::kAccumulate);
  ASSERT_EQ(s1.source, TapeSignature::Source::kLog);
  ASSERT_EQ(s2.source, TapeSignature::Source::kLog);
  EXPECT_FALSE(s1.same_structure(s2));
  log.new_step();
  const Tensor t3 = two_stream_tape(caller, fake_stream(7), fake_stream(8), la, lb);
  EXPECT_TRUE(
      s1.same_structure(tape_signature({t3}, {zeros({1})}, caller, GradWrite::kAccumulate)));
  // ... and called from another stream: another structure.
  log.new_step();
  const Tensor t4 = two_stream_tape(caller, fake_stream(2), fake_stream(3), la, lb);
  EXPECT_FALSE(s1.same_structure(
      tape_signature({t4}, {zeros({1})}, fake_stream(9), GradWrite::kAccumulate)));
  // A .grad appearing, and a replaced .grad.
  log.new_step();
  Tensor loss = m.loss(x);
  backward(loss, {.retain_graph = true});
  log.new_step();
  loss = m.loss(x);
  const TapeSignature with_grads = sig(loss);
  ASSERT_EQ(with_grads.source, TapeSignature::Source::kLog);
  EXPECT_FALSE(base.same_structure(with_grads));
  TapeSignature refreshed = with_grads;
  m.w1.grad() = zeros(m.w1.shape());
  refresh_leaves(refreshed, {loss}, {}, nullptr, GradWrite::kAccumulate);
  EXPECT_TRUE(refreshed.same_structure(with_grads));
  EXPECT_FALSE(refreshed.same_addresses(with_grads));
  EXPECT_NE(describe_difference(with_grads, refreshed).find(".grad of leaf"), std::string::npos)
      << describe_difference(with_grads, refreshed);
}

// Note [Node attributes]: what an op's backward uses besides tensors and shapes is part of the
// structure, by the log and by the walk alike — two steps that differ only there are never one
// graph (a replay would run the values it was captured with) — and the reason names them. Each
// pair below has the same shapes everywhere.
TEST(TapeLog, WhatABackwardUsesBesidesShapesIsPartOfTheStructure) {
  using Forward = std::function<Tensor(const Tensor&)>;
  struct Case {
    const char* what;
    Shape x;
    Forward a, b;
  };
  const Tensor w = randn({1, 1, 3, 3}, 3).set_requires_grad(true);
  const std::vector<Case> cases = {
      {"a scale factor",
       {4, 4},
       [](const Tensor& x) { return mul(x, 2.0); },
       [](const Tensor& x) { return mul(x, 3.0); }},
      {"a window's start",
       {4, 4},
       [](const Tensor& x) { return narrow(x, 0, 2); },
       [](const Tensor& x) { return narrow(x, 1, 2); }},
      {"split_heads' window",
       {4, 8},
       [](const Tensor& x) { return split_heads(x, 2, 2, 0, 4); },
       [](const Tensor& x) { return split_heads(x, 2, 2, 4, 4); }},
      {"the dimensions a transpose swaps",
       {2, 2, 2},
       [](const Tensor& x) { return transpose(x, 0, 1); },
       [](const Tensor& x) { return transpose(x, 1, 2); }},
      {"a transposed operand",
       {2, 3, 3},
       [](const Tensor& x) { return bmm(x, x); },
       [](const Tensor& x) { return bmm(x, x, true); }},
      {"a batched product's scale",
       {2, 3, 3},
       [](const Tensor& x) { return bmm(x, x, false, true, 0.5); },
       [](const Tensor& x) { return bmm(x, x, false, true, 0.25); }},
      {"a convolution's stride and padding",
       {1, 1, 4, 4},
       [&](const Tensor& x) { return conv2d(x, w, Tensor(), {.stride = 1, .padding = 0}); },
       [&](const Tensor& x) { return conv2d(x, w, Tensor(), {.stride = 2, .padding = 1}); }},
      {"a max pool's window",
       {1, 1, 4, 4},
       [](const Tensor& x) { return max_pool2d(x, {.kernel = 2}); },
       [](const Tensor& x) { return max_pool2d(x, {.kernel = 3, .stride = 1}); }},
      {"an average pool's window",
       {1, 1, 4, 4},
       [](const Tensor& x) { return avg_pool2d(x, {.kernel = 2}); },
       [](const Tensor& x) { return avg_pool2d(x, {.kernel = 3, .stride = 1}); }},
  };
  ArmedLog log;
  for (const Case& c : cases) {
    const Tensor x = randn(c.x, 7).set_requires_grad(true);
    struct Both {
      TapeSignature logged, walked;
    };
    auto signatures = [&](const Forward& f) {
      log.new_step();
      const Tensor loss = sum(f(x));
      Both s{sig(loss), {}};
      tape_signature_walk(s.walked, {loss}, {}, nullptr, GradWrite::kAccumulate);
      return s;
    };
    const Both a = signatures(c.a), again = signatures(c.a), b = signatures(c.b);
    ASSERT_EQ(a.logged.source, TapeSignature::Source::kLog) << c.what;
    ASSERT_EQ(b.logged.source, TapeSignature::Source::kLog) << c.what;
    EXPECT_TRUE(a.logged.same_structure(again.logged)) << c.what;
    EXPECT_TRUE(a.walked.same_structure(again.walked)) << c.what;
    EXPECT_FALSE(a.logged.same_structure(b.logged)) << c.what << " changed, the log saw nothing";
    EXPECT_FALSE(a.walked.same_structure(b.walked)) << c.what << " changed, the walk saw nothing";
    const std::string why = describe_difference(a.logged, b.logged);
    EXPECT_NE(why.find("attributes: "), std::string::npos) << c.what << ": " << why;
  }
}

TEST(TapeLog, FallsBackToTheWalkWheneverTheLogCannotStandForTheTape) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  {
    const TapeSignature s = sig(m.loss(x));  // not armed
    EXPECT_EQ(s.source, TapeSignature::Source::kWalk);
    EXPECT_NE(std::string(s.walk_reason).find("no BackwardGraph"), std::string::npos);
  }
  ArmedLog log;
  {  // an input from a node made before the step
    const Tensor h = relu(linear(x, m.w0, m.b0));
    log.new_step();
    const Tensor loss = mse_loss(add(h, relu(linear(x, m.w1, m.b1))), m.target);
    const TapeSignature s = sig(loss);
    EXPECT_EQ(s.source, TapeSignature::Source::kWalk);
    EXPECT_NE(std::string(s.walk_reason).find("before the step"), std::string::npos)
        << s.walk_reason;
    EXPECT_EQ(s.num_nodes(), 6);
  }
  {  // the log was taken already: the second signature of a step walks
    log.new_step();
    const Tensor loss = m.loss(x);
    EXPECT_EQ(sig(loss).source, TapeSignature::Source::kLog);
    const TapeSignature again = sig(loss);
    EXPECT_EQ(again.source, TapeSignature::Source::kWalk);
    EXPECT_NE(std::string(again.walk_reason).find("taken"), std::string::npos);
  }
  {  // the loss was computed before the step began
    const Tensor loss = m.loss(x);
    log.new_step();
    EXPECT_EQ(sig(loss).source, TapeSignature::Source::kWalk);
  }
  {  // a saved tensor modified in place: the walk refuses it by name, as backward() would
    log.new_step();
    const Tensor loss = m.loss(x);
    {
      NoGradGuard no_grad;
      add_(m.w0, ones(m.w0.shape()), 0.5);
    }
    GW_EXPECT_ERROR(sig(loss), "modified in place", "linear");
  }
  {  // released by an eager backward: refused by name, as a second backward would be
    log.new_step();
    const Tensor loss = m.loss(x);
    backward(loss);
    GW_EXPECT_ERROR(sig(loss), "a second time");
  }
  {  // an in-place update of a parameter no live node saved (an optimizer step) is no mutation
    log.new_step();
    {
      NoGradGuard no_grad;
      add_(m.w0, ones(m.w0.shape()), 0.5);
    }
    const Tensor loss = m.loss(x);
    EXPECT_EQ(sig(loss).source, TapeSignature::Source::kLog);
  }
}

TEST(TapeLog, NodesTheLossDoesNotReachKeepTheSignatureConservative) {
  ArmedLog log;
  Model m;
  const Tensor x = randn({5, 6}, 10);
  auto step = [&] {
    log.new_step();
    const Tensor unused = relu(linear(x, m.w1, m.b1));  // logged, not reached by the loss
    const Tensor loss = m.loss(x);
    return sig(loss);
  };
  const TapeSignature a = step(), b = step();
  ASSERT_EQ(a.source, TapeSignature::Source::kLog);
  EXPECT_EQ(a.num_nodes(), 8);  // the walk reaches 6
  EXPECT_TRUE(a.same_structure(b));
  log.new_step();
  EXPECT_FALSE(a.same_structure(sig(m.loss(x))));  // without them: another structure
}

TEST(TapeLog, ASignatureReusedStepAfterStepSeesEveryChangeOfALeafsGrad) {
  ArmedLog log;
  Model m;
  backward(m.loss(randn({5, 6}, 10)));  // every leaf has a .grad
  const Tensor x = randn({5, 6}, 10);
  TapeSignature s;  // reused, as BackwardGraph reuses its own (with its memo of the .grads)
  auto step = [&] {
    log.new_step();
    const Tensor loss = m.loss(x);
    tape_signature(s, {loss}, {}, nullptr, GradWrite::kAccumulate);
    EXPECT_EQ(s.source, TapeSignature::Source::kLog);
    TapeSignature copy = s;
    copy.nodes.clear();
    copy.leaves.clear();
    return copy;
  };
  const TapeSignature a = step(), b = step();
  EXPECT_TRUE(a.same_structure(b));
  EXPECT_FALSE(a.grads_unchanged);  // nothing to compare with yet
  EXPECT_TRUE(b.grads_unchanged);
  // Only the activations moved: every leaf's data and .grad address is the same.
  for (std::size_t i = 0; i < a.addresses.size(); ++i) {
    const std::string who = a.address_owner_str(i);
    if (who.find("leaf") != std::string::npos) {
      EXPECT_EQ(a.addresses[i], b.addresses[i]) << who;
    }
  }
  m.w1.grad() = zeros(m.w1.shape());  // a new .grad tensor
  const TapeSignature c = step();
  EXPECT_TRUE(b.same_structure(c));
  EXPECT_FALSE(c.grads_unchanged);
  EXPECT_TRUE(step().grads_unchanged);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < b.addresses.size(); ++i) {
    const std::string who = b.address_owner_str(i);
    if (who.find("leaf") != std::string::npos && b.addresses[i] != c.addresses[i]) {
      ++moved;
      EXPECT_NE(who.find(".grad of leaf"), std::string::npos) << who;
    }
  }
  EXPECT_EQ(moved, 1u);
  m.w1.grad() = Tensor();  // no .grad: another structure
  const TapeSignature d = step();
  EXPECT_FALSE(c.same_structure(d));
  m.w1.grad() = zeros({36});  // a .grad of another shape: another structure again
  const TapeSignature e = step();
  EXPECT_FALSE(c.same_structure(e));
  EXPECT_FALSE(d.same_structure(e));
  m.w1.grad() = zeros(m.w1.shape());
  EXPECT_TRUE(c.same_structure(step()));
}

TEST(TapeLog, TheForwardIsComparedWithTheLastReplayedTapeAsItIsRecorded) {
  ArmedLog log;
  Model m;
  const Tensor x = randn({5, 6}, 10);
  log.new_step();
  // The first step's tape stays alive, so a later step's activations are new memory (freed, they
  // could be handed out again at the same addresses, and the update below would be a replay).
  const Tensor first = m.loss(x);
  const TapeSignature a = sig(first);
  ASSERT_EQ(a.source, TapeSignature::Source::kLog);
  EXPECT_EQ(a.nodes_equal_to, nullptr);  // nothing expected yet
  const auto part = std::make_shared<const Words>(
      a.structure.begin(), a.structure.begin() + static_cast<std::ptrdiff_t>(a.nodes_words));
  auto step = [&](const std::function<Tensor()>& forward, GradWrite mode = GradWrite::kAccumulate) {
    detail::tape_log_expect(part);
    log.new_step();
    const Tensor loss = forward();
    return sig(loss, mode);
  };
  const TapeSignature same = step([&] { return m.loss(x); });
  EXPECT_EQ(same.nodes_equal_to, part.get());
  EXPECT_EQ(step([&] { return m.loss(x, true); }).nodes_equal_to, nullptr);      // another op
  EXPECT_EQ(step([&] { return mul(m.loss(x), 2.0); }).nodes_equal_to, nullptr);  // longer
  EXPECT_EQ(step([&] { return sum(relu(linear(x, m.w0, m.b0))); }).nodes_equal_to,
            nullptr);  // shorter
  // The cache then compares only the rest and the addresses.
  GraphCache<int> cache(2);
  cache.insert(a, 1);
  auto d = cache.decide_nodes_known(*cache.most_recent(), same);
  ASSERT_EQ(d.action, GraphCache<int>::Action::kUpdate);  // new activations
  EXPECT_NE(d.reason.find("addresses changed"), std::string::npos) << d.reason;
  cache.count_update(*d.entry, same);
  EXPECT_EQ(cache.decide_nodes_known(*cache.most_recent(), same).action,
            GraphCache<int>::Action::kReplay);
  // Same nodes, another gradient mode: the rest differs, and the full decision says so.
  const TapeSignature overwrite = step([&] { return m.loss(x); }, GradWrite::kOverwrite);
  EXPECT_EQ(overwrite.nodes_equal_to, part.get());
  d = cache.decide_nodes_known(*cache.most_recent(), overwrite);
  EXPECT_EQ(d.action, GraphCache<int>::Action::kCapture);
  detail::tape_log_expect(nullptr);
}

// ---- the graph cache's policy -------------------------------------------------------------------

using Cache = GraphCache<int>;

TEST(GraphCache, CaptureThenReplayThenUpdateThenCaptureANewStructure) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  Cache cache(4);
  const Tensor loss = m.loss(x);
  const TapeSignature s = sig(loss);
  auto d = cache.decide(s);
  EXPECT_EQ(d.action, Cache::Action::kCapture);
  EXPECT_EQ(d.reason, "no graph captured yet");
  cache.insert(s, 1);
  d = cache.decide(s);
  ASSERT_EQ(d.action, Cache::Action::kReplay);
  EXPECT_EQ(d.entry->exec, 1);
  EXPECT_TRUE(d.reason.empty());
  // Same structure, new activations: update the same entry.
  const TapeSignature s2 = sig(m.loss(x));
  d = cache.decide(s2);
  ASSERT_EQ(d.action, Cache::Action::kUpdate);
  EXPECT_EQ(d.entry->exec, 1);
  EXPECT_NE(d.reason.find("addresses changed"), std::string::npos) << d.reason;
  cache.count_update(*d.entry, s2);
  EXPECT_EQ(cache.decide(s2).action, Cache::Action::kReplay);
  // A new structure: capture, with the difference against the last graph as the reason.
  const TapeSignature s3 = sig(m.loss(x, true));
  d = cache.decide(s3);
  EXPECT_EQ(d.action, Cache::Action::kCapture);
  EXPECT_NE(d.reason.find("tanh"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("1 cached graph"), std::string::npos) << d.reason;
  cache.insert(s3, 2);
  EXPECT_EQ(cache.decide(s3).action, Cache::Action::kReplay);
  EXPECT_EQ(cache.decide(s2).action, Cache::Action::kReplay);  // the first graph is still there
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.counters().captures, 2u);
  EXPECT_EQ(cache.counters().updates, 1u);
}

TEST(GraphCache, BoundedLeastRecentlyUsedOut) {
  Cache cache(2);
  std::vector<TapeSignature> sigs;
  std::vector<Tensor> keep;  // the tapes stay alive
  for (std::int64_t width : {3, 4, 5}) {
    Model m(width);
    m.target = randn({5, width}, 5);
    keep.push_back(m.loss(randn({5, width}, 10)));
    sigs.push_back(sig(keep.back()));
  }
  cache.insert(sigs[0], 0);
  cache.insert(sigs[1], 1);
  EXPECT_EQ(cache.decide(sigs[0]).action, Cache::Action::kReplay);  // 0 is now the most recent
  cache.insert(sigs[2], 2);                                         // evicts 1
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.counters().evictions, 1u);
  EXPECT_EQ(cache.decide(sigs[0]).action, Cache::Action::kReplay);
  EXPECT_EQ(cache.decide(sigs[2]).action, Cache::Action::kReplay);
  EXPECT_EQ(cache.decide(sigs[1]).action, Cache::Action::kCapture);
  GW_EXPECT_ERROR(Cache(0), "capacity");
}

// Note [Input slots]: an entry's unbound addresses are not compared, but the positions of one
// group must still point at one tensor; changed_addresses lists the others that moved.
TEST(GraphCache, UnboundAddressesAreNotComparedButTheirGroupsMustHold) {
  auto make = [](std::vector<std::uintptr_t> addresses) {
    TapeSignature t;
    t.structure = {1, 2, 3};
    t.structure_hash = 42;
    t.addresses = std::move(addresses);
    t.address_owners.assign(t.addresses.size(), 0);
    t.address_hash = t.addresses[0] * 31 + t.addresses[1];
    return t;
  };
  Cache cache(2);
  cache.insert(make({10, 20, 30, 20}), 1, {{3, 1}, {1, 1}});  // sorted on insert
  ASSERT_EQ(cache.most_recent()->unbound.size(), 2u);
  EXPECT_EQ(cache.most_recent()->unbound[0].position, 1u);
  // The group moved together: a replay.
  auto d = cache.decide(make({10, 99, 30, 99}));
  EXPECT_EQ(d.action, Cache::Action::kReplay) << d.reason;
  EXPECT_EQ(cache.decide_nodes_known(*cache.most_recent(), make({10, 77, 30, 77})).action,
            Cache::Action::kReplay);
  // The group split (two tensors where the capture saw one): an update, saying so.
  d = cache.decide(make({10, 99, 30, 98}));
  ASSERT_EQ(d.action, Cache::Action::kUpdate);
  EXPECT_NE(d.reason.find("differs among them"), std::string::npos) << d.reason;
  EXPECT_TRUE(Cache::changed_addresses(*d.entry, make({10, 99, 30, 98})).empty());
  // A bound address moved: an update, and it is the one listed.
  d = cache.decide(make({11, 99, 30, 99}));
  ASSERT_EQ(d.action, Cache::Action::kUpdate);
  EXPECT_NE(d.reason.find("1 of 4 addresses changed"), std::string::npos) << d.reason;
  EXPECT_EQ(Cache::changed_addresses(*d.entry, make({11, 99, 31, 99})),
            (std::vector<std::uint32_t>{0, 2}));
  // Without unbound addresses, every one counts.
  Cache plain(1);
  plain.insert(make({10, 20, 30, 20}), 1);
  EXPECT_EQ(plain.decide(make({10, 99, 30, 99})).action, Cache::Action::kUpdate);
}

// Node::saved_from_outside: which saved tensors entered the tape from outside (the batch and the
// target), as opposed to parameters and activations.
TEST(TapeSignature, SavedInputsFromOutsideAreMarkedParametersAndActivationsAreNot) {
  Model m;
  const Tensor x = randn({5, 6}, 10);
  const Tensor loss = m.loss(x);
  const Node& mse = *loss.grad_fn();
  ASSERT_EQ(mse.name(), "mse_loss");
  bool target_marked = false;
  for (std::size_t j = 0; j < mse.saved().size(); ++j) {
    const bool is_target = mse.saved()[j].tensor.raw_data() == m.target.raw_data();
    EXPECT_EQ(mse.saved_from_outside(j), is_target) << mse.saved()[j].name;
    target_marked = target_marked || (is_target && mse.saved_from_outside(j));
  }
  EXPECT_TRUE(target_marked);
  // Every linear: the input x (from outside), the weight (a parameter: not).
  std::vector<const Node*> todo = {&mse};
  int linears = 0;
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    for (const InputMeta& in : n->inputs()) {
      if (in.edge.node) todo.push_back(in.edge.node.get());
    }
    for (std::size_t j = 0; j < n->saved().size(); ++j) {
      const Tensor& t = n->saved()[j].tensor;
      if (!t.defined()) continue;
      const bool outside = t.raw_data() == x.raw_data() || t.raw_data() == m.target.raw_data();
      EXPECT_EQ(n->saved_from_outside(j), outside) << n->label() << " saved " << n->saved()[j].name;
    }
    linears += n->name() == "linear";
  }
  EXPECT_EQ(linears, 2);
  // A detached activation is not from outside (a recorded op made its memory).
  const Tensor h = relu(linear(x, m.w0, m.b0));
  const Tensor y = mse_loss(linear(h.detach(), m.w1, m.b1), m.target);
  const Node& lin = *y.grad_fn()->inputs()[0].edge.node;
  ASSERT_EQ(lin.name(), "linear");
  for (std::size_t j = 0; j < lin.saved().size(); ++j) {
    if (lin.saved()[j].tensor.raw_data() == h.raw_data()) {
      EXPECT_FALSE(lin.saved_from_outside(j));
    }
  }
}

TEST(GraphCache, EntriesOutliveTheTapeTheyWereCapturedFrom) {
  Cache cache(2);
  {
    Model m;
    const Tensor loss = m.loss(randn({5, 6}, 10));
    cache.insert(sig(loss), 7);
  }  // the tape and its op names are gone; the entry owns copies
  Model m;
  m.target = randn({2, 6}, 5);
  const Tensor loss = m.loss(randn({2, 6}, 10));
  const auto d = cache.decide(sig(loss));
  EXPECT_EQ(d.action, Cache::Action::kCapture);
  EXPECT_NE(d.reason.find("mse_loss"), std::string::npos) << d.reason;
}

}  // namespace
}  // namespace graphward::capture
