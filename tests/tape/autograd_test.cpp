// Autograd on the CPU backend: gradients of composed models against finite differences, fan-out,
// multiple roots, retain_graph, unused inputs, the no-grad scope, leaves reached by several paths,
// saved-tensor version checks and the gradient write modes.
#include "graphward/engine/tape/tape_log.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::rel_error;
using testing::values;

Tensor param(const Shape& s, std::uint64_t seed) {
  return randn(s, seed, f64()).set_requires_grad(true);
}

// Central finite differences of scalar f with respect to every element of p.
std::vector<double> numeric_grad(const std::function<double()>& f, const Tensor& p) {
  std::vector<double> g(static_cast<std::size_t>(p.numel()));
  const double h = 1e-6;
  for (std::size_t j = 0; j < g.size(); ++j) {
    double* x = p.data<double>() + j;
    const double saved = *x;
    *x = saved + h;
    const double fp = f();
    *x = saved - h;
    const double fm = f();
    *x = saved;
    g[j] = (fp - fm) / (2 * h);
  }
  return g;
}

TEST(AutogradCpu, BranchModelGradientsMatchFiniteDifferences) {
  // Two branches of linear + tanh/relu summed, a bias-broadcast add and an mse loss.
  const Tensor x = randn({6, 4}, 1, f64()), target = randn({6, 3}, 2, f64());
  const Tensor w1 = param({5, 4}, 3), b1 = param({5}, 4), w2 = param({3, 5}, 5);
  const Tensor v1 = param({5, 4}, 6), v2 = param({3, 5}, 7), c = param({3}, 8);
  auto forward = [&] {
    const Tensor a = linear(graphward::tanh(linear(x, w1, b1)), w2);
    const Tensor b = linear(relu(linear(x, v1)), v2);
    return mse_loss(add(add(a, b), c), target);
  };
  const Tensor loss = forward();
  ASSERT_TRUE(loss.grad_fn());
  backward(loss);
  auto f = [&] {
    NoGradGuard g;
    return forward().item();
  };
  for (const Tensor& p : {w1, b1, w2, v1, v2, c}) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_LT(rel_error(values(p.grad()), numeric_grad(f, p)), 1e-6) << p.str();
  }
}

TEST(AutogradCpu, ALinearWithAFusedActivationIsOneNodeWithTheComposedOpsGradients) {
  for (const Activation act : {Activation::kRelu, Activation::kGelu}) {
    const Tensor x = param({6, 5}, 61), w = param({4, 5}, 62), b = param({4}, 63);
    const Tensor x2 = param({6, 5}, 61), w2 = param({4, 5}, 62), b2 = param({4}, 63);
    const Tensor t = randn({6, 4}, 64, f64());
    const Tensor y = linear(x, w, b, act);
    ASSERT_TRUE(y.grad_fn());
    EXPECT_EQ(y.grad_fn()->name(), act == Activation::kRelu ? "linear_relu" : "linear_gelu");
    EXPECT_EQ(y.grad_fn()->inputs().size(), 3u);
    backward(mse_loss(y, t));
    const Tensor z = linear(x2, w2, b2);
    backward(mse_loss(act == Activation::kRelu ? relu(z) : gelu(z), t));
    for (auto [a, c] : {std::pair{x, x2}, std::pair{w, w2}, std::pair{b, b2}}) {
      EXPECT_LT(rel_error(a.grad(), c.grad()), 1e-14) << static_cast<int>(act);
    }
  }
}

// Note [Non-finite loss]: a NaN or infinite root is refused before anything is written, with the
// root named; the .grads keep what earlier backwards accumulated; the tape is left whole.
TEST(AutogradCpu, ANonFiniteLossIsRefusedWhenCheckedAndNothingIsWritten) {
  const Tensor x = param({5}, 12);
  backward(sum(mul(x, x)), {.check_finite_loss = true});  // a finite loss passes
  const std::vector<double> before = values(x.grad());
  for (double bad : {std::nan(""), double{INFINITY}, -double{INFINITY}}) {
    const Tensor p = randn({5}, 13, f64());
    p.data<double>()[2] = bad;
    const Tensor loss = sum(mul(x, p));
    GW_EXPECT_ERROR(backward(loss, {.check_finite_loss = true}), "backward: root 0",
                    "1 non-finite value", "expected a finite loss", "Nothing was written");
    EXPECT_EQ(values(x.grad()), before) << "a refused backward wrote a .grad";
    // Unchecked, the same tape still runs (it was left whole): x's gradient gains p.
    backward(loss);
    EXPECT_FALSE(std::isfinite(values(x.grad())[2]));
    x.grad() = Tensor();
    backward(sum(mul(x, x)));
    EXPECT_EQ(values(x.grad()), before);
  }
  // Of several roots, the bad one is named.
  const Tensor p = randn({5}, 14, f64());
  p.data<double>()[0] = std::nan("");
  GW_EXPECT_ERROR(backward({sum(x), sum(mul(x, p))}, {}, {.check_finite_loss = true}),
                  "backward: root 1");
  EXPECT_EQ(values(x.grad()), before);
}

// The check reads a bfloat16 loss through a float32 cast: that cast is no node of the tape (a
// BackwardGraph's tape log would take it for part of the step).
TEST(AutogradCpu, TheFiniteLossCheckOfABFloat16LossRecordsNoNode) {
  const Tensor x = randn({5}, 12).set_requires_grad(true);
  const Tensor loss = cast(sum(mul(x, x)), DType::kBFloat16);
  struct Armed {  // this thread's tape log, as a live BackwardGraph arms it (Note [Tape log])
    Armed() { detail::tape_log_arm(); }
    ~Armed() { detail::tape_log_disarm(); }
  } armed;
  detail::tape_log_reset();
  backward(loss, {.check_finite_loss = true});
  EXPECT_EQ(detail::tape_log().nodes.size(), 0u) << "the check recorded a node";
  ASSERT_TRUE(x.grad().defined());
}

TEST(AutogradCpu, FanOutSumsTheGradients) {
  // y = sum(x * x + x): dy/dx = 2x + 1; x is used three times.
  const Tensor x = param({7}, 11);
  backward(sum(add(mul(x, x), x)));
  std::vector<double> expected;
  for (double v : values(x)) expected.push_back(2 * v + 1);
  EXPECT_LT(rel_error(values(x.grad()), expected), 1e-15);
}

TEST(AutogradCpu, LeafReachedBySeveralPathsAndAnIntermediateUsedTwice) {
  const Tensor x = randn({3, 4}, 1, f64());
  const Tensor w = param({4, 4}, 2);
  auto forward = [&] {
    const Tensor h = linear(x, w);        // w on path 1
    const Tensor z = linear(relu(h), w);  // w on path 2, h used below as well
    return sum(add(z, mul(h, 2.0)));
  };
  backward(forward());
  auto f = [&] {
    NoGradGuard g;
    return forward().item();
  };
  EXPECT_LT(rel_error(values(w.grad()), numeric_grad(f, w)), 1e-6);
}

TEST(AutogradCpu, MultipleRootsEqualTheSumOfSeparateBackwards) {
  const Tensor w = param({3, 3}, 1);
  const Tensor x = randn({2, 3}, 2, f64());
  auto roots = [&] {
    const Tensor h = linear(x, w);
    return std::vector<Tensor>{sum(relu(h)), mean(graphward::tanh(h))};
  };
  backward(roots());
  const std::vector<double> together = values(w.grad());
  w.grad() = Tensor();
  std::vector<Tensor> r = roots();
  backward(r[0], {.retain_graph = true});  // r[1] shares the linear node
  backward(r[1]);
  EXPECT_LT(rel_error(values(w.grad()), together), 1e-15);
}

TEST(AutogradCpu, SeedGradientForANonScalarRoot) {
  const Tensor x = param({2, 3}, 1);
  const Tensor y = mul(x, 3.0);
  GW_EXPECT_ERROR(backward(y), "root 0", "[2, 3]", "seed gradient");
  const Tensor seed = randn({2, 3}, 2, f64());
  backward({y}, {seed});
  EXPECT_LT(rel_error(values(x.grad()), values(mul(seed, 3.0))), 1e-15);
  GW_EXPECT_ERROR(backward({mul(x, 2.0)}, {randn({3}, 1, f64())}), "seed gradient of root 0", "[3]",
                  "[2, 3]");
}

TEST(AutogradCpu, RetainGraphAllowsASecondBackwardAndItsAbsenceIsAnError) {
  const Tensor w = param({4}, 1);
  const Tensor loss = sum(mul(relu(w), w));
  backward(loss, {.retain_graph = true});
  const std::vector<double> once = values(w.grad());
  backward(loss);  // graph freed after this one
  std::vector<double> twice;
  for (double v : once) twice.push_back(2 * v);
  EXPECT_LT(rel_error(values(w.grad()), twice), 1e-15);
  const std::vector<double> before = values(w.grad());
  GW_EXPECT_ERROR(backward(loss), "a second time", "retain_graph");
  EXPECT_EQ(values(w.grad()), before) << "a refused backward must write nothing";
}

TEST(AutogradCpu, BackwardWithoutRetainGraphFreesTheSavedActivations) {
  // The relu output h is saved by relu (its backward reads it) and by mul; after a backward
  // without retain_graph only the caller's handle is left on its memory. With retain_graph the
  // graph still holds it.
  const Tensor w = param({4}, 1);
  const Tensor h = relu(w);
  const Tensor loss = sum(mul(h, w));
  EXPECT_GT(h.storage().use_count(), 1);
  backward(loss, {.retain_graph = true});
  EXPECT_GT(h.storage().use_count(), 1);
  backward(loss);
  EXPECT_EQ(h.storage().use_count(), 1);
}

TEST(AutogradCpu, SplitWeightGradientsGiveTheSameGradients) {
  // Weight-gradient parallelism moves work between streams, never changes the math: on the CPU
  // (no streams) the split plan must give exactly the unsplit gradients, shared weights included.
  const Tensor w1 = param({6, 6}, 1), b1 = param({6}, 2), w2 = param({6, 6}, 3), b2 = param({6}, 4);
  const Tensor x = randn({5, 6}, 5, f64()), target = randn({5, 6}, 6, f64());
  auto loss = [&] {
    const Tensor h1 = relu(linear(x, w1, b1));
    const Tensor h2 = tanh(linear(h1, w2, b2));
    return mse_loss(linear(h2, w1, b1), target);  // w1, b1 used twice
  };
  backward(loss());
  std::vector<std::vector<double>> plain;
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) {
    plain.push_back(values(t->grad()));
    t->grad() = Tensor();
  }
  const Tensor planned = loss();  // a plan points into its tape: the root keeps it alive
  const BackwardPlan p = plan_for({planned}, GradWrite::kAccumulate, {.split_weight_grads = true});
  int split = 0;
  for (const auto& st : p.steps) split += st.side_stream >= 0;
  EXPECT_EQ(split, 2) << p.dump();  // the two linears fed by another node
  backward(loss(), {.split_weight_grads = true});
  int i = 0;
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) EXPECT_EQ(values(t->grad()), plain[i++]);
}

// Note [Backward epilogue fusion]: a linear+activation layer whose output feeds one linear layer
// alone leaves its activation backward to that layer. On the CPU the fused plan runs the same
// arithmetic in the same order: the gradients are bitwise the unfused ones, through a chain of
// fused layers (ReLU into GELU into a plain linear), in both write modes, with a bias that is a
// leaf and one that a node made.
TEST(AutogradCpu, FusedActivationEpiloguesGiveTheUnfusedGradientsBitwise) {
  const Tensor w1 = param({7, 5}, 1), b1 = param({7}, 2), w2 = param({6, 7}, 3), b2 = param({6}, 4),
               w3 = param({3, 6}, 5), b3 = param({3}, 6);
  const Tensor x = param({4, 5}, 7), target = randn({4, 3}, 8, f64());
  auto loss = [&] {
    const Tensor h1 = linear(x, w1, b1, Activation::kRelu);
    // A bias made by a node (as a cast to bfloat16 makes one): its gradient buffer moves too.
    const Tensor h2 = linear(h1, w2, mul(b2, 1.5), Activation::kGelu);
    return mse_loss(linear(h2, w3, b3), target);
  };
  const std::vector<const Tensor*> params{&x, &w1, &b1, &w2, &b2, &w3, &b3};
  const Tensor planned = loss();  // a plan points into its tape: the root keeps it alive
  const BackwardPlan fused = plan_for({planned});
  int fusing = 0, from_pre = 0;
  for (const auto& st : fused.steps) {
    fusing += st.fuses_activation_of >= 0;
    from_pre += st.preactivation_grad;
    if (st.fuses_activation_of >= 0) {
      EXPECT_TRUE(fused.steps[st.fuses_activation_of].preactivation_grad) << fused.dump();
    }
  }
  EXPECT_EQ(fusing, 2) << fused.dump();
  EXPECT_EQ(from_pre, 2) << fused.dump();
  const BackwardPlan plain =
      plan_for({planned}, GradWrite::kAccumulate, {.fuse_activation_epilogues = false});
  for (const auto& st : plain.steps) {
    EXPECT_EQ(st.fuses_activation_of, -1);
    EXPECT_FALSE(st.preactivation_grad);
  }
  for (const GradWrite mode : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
    std::vector<std::vector<double>> expected;
    for (const Tensor* t : params) t->grad() = Tensor();
    for (int i = 0; i < 2; ++i) {  // twice: the second accumulates into .grad under kAccumulate
      backward(loss(), {.grad_write = mode, .fuse_activation_epilogues = false});
    }
    for (const Tensor* t : params) {
      expected.push_back(values(t->grad()));
      t->grad() = Tensor();
    }
    for (int i = 0; i < 2; ++i) backward(loss(), {.grad_write = mode});
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(values(params[i]->grad()), expected[i]) << "parameter " << i;
    }
  }
}

// What the plan must not fuse: an activation output read by another op too, a consumer that is
// not a linear layer; what it may: a layer without a bias, a bias shared by two layers.
TEST(AutogradCpu, ActivationEpiloguesAreFusedOnlyWhereNothingElseSeesTheDifference) {
  const Tensor w1 = param({5, 5}, 1), b1 = param({5}, 2), w2 = param({5, 5}, 3), b2 = param({5}, 4);
  const Tensor x = param({3, 5}, 5);
  auto fused_steps = [](const Tensor& loss) {
    int n = 0;
    for (const auto& st : plan_for({loss}).steps) n += st.fuses_activation_of >= 0;
    return n;
  };
  const Tensor h = linear(x, w1, b1, Activation::kRelu);
  EXPECT_EQ(fused_steps(sum(linear(h, w2, b2))), 1);
  EXPECT_EQ(fused_steps(add(sum(linear(h, w2, b2)), sum(h))), 0) << "h read twice";
  EXPECT_EQ(fused_steps(sum(linear(linear(x, w1, Tensor(), Activation::kRelu), w2, b2))), 1)
      << "no bias";
  EXPECT_EQ(fused_steps(sum(linear(linear(x, w1, b1, Activation::kRelu), w2, b1))), 1)
      << "b1 shared";
  EXPECT_EQ(fused_steps(sum(matmul(h, w2))), 0) << "matmul takes no epilogue";
  EXPECT_EQ(fused_steps(sum(linear(h, w2, b2, Activation::kGelu))), 1);
}

TEST(AutogradCpu, UnusedInputsAndBranchesGetNoGradient) {
  const Tensor used = param({3}, 1), unused = param({3}, 2), side = param({3}, 3);
  const Tensor branch_not_in_loss = mul(side, 2.0);  // computed, never part of the loss
  (void)branch_not_in_loss;
  backward(sum(mul(used, 2.0)));
  EXPECT_TRUE(used.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_FALSE(side.grad().defined());
}

TEST(AutogradCpu, NoGradScopeRecordsNothing) {
  const Tensor w = param({3}, 1);
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(grad_mode_enabled());
    const Tensor y = mul(w, 2.0);
    EXPECT_FALSE(y.grad_fn());
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_TRUE(grad_mode_enabled());
  EXPECT_TRUE(mul(w, 2.0).grad_fn());
  const Tensor plain = randn({3}, 2, f64());
  EXPECT_FALSE(mul(plain, 2.0).grad_fn()) << "no input requires grad: nothing to record";
  GW_EXPECT_ERROR(backward(mul(plain, 2.0)), "does not require grad");
}

TEST(AutogradCpu, InPlaceChangeOfASavedTensorIsNamedAndNothingIsWritten) {
  const Tensor w = param({3, 3}, 1);
  const Tensor x = randn({2, 3}, 2, f64());
  const Tensor h = linear(x, w);  // saves x and w
  const Tensor loss = sum(relu(h));
  add_(x, ones({2, 3}, f64()));  // x moves from version 0 to 1
  GW_EXPECT_ERROR(backward(loss), "linear#", "modified in place", "'x'", "version 1",
                  "expected version 0");
  EXPECT_FALSE(w.grad().defined()) << "the refused backward launched something";
}

TEST(AutogradCpu, InPlaceOnATensorThatRequiresGradNeedsNoGrad) {
  const Tensor w = param({3}, 1);
  GW_EXPECT_ERROR(add_(w, ones({3}, f64())), "add_", "requires grad", "NoGradGuard");
  NoGradGuard g;
  add_(w, ones({3}, f64()), -0.5);  // an optimizer step
  EXPECT_EQ(w.version(), 1u);
}

TEST(AutogradCpu, GradWriteAccumulateAddsAndOverwriteReplaces) {
  const Tensor w = param({4}, 1);
  auto loss = [&] { return sum(mul(w, 3.0)); };
  backward(loss());
  backward(loss());
  EXPECT_EQ(values(w.grad()), std::vector<double>(4, 6.0));
  backward(loss(), {.grad_write = GradWrite::kOverwrite});
  EXPECT_EQ(values(w.grad()), std::vector<double>(4, 3.0));
  // Overwrite still sums the contributions of one backward.
  backward(sum(add(mul(w, 3.0), mul(w, 2.0))), {.grad_write = GradWrite::kOverwrite});
  EXPECT_EQ(values(w.grad()), std::vector<double>(4, 5.0));
}

TEST(AutogradCpu, MicroBatchAccumulationEqualsOneBigBatch) {
  const Tensor x = randn({8, 5}, 1, f64()), t = randn({8, 2}, 2, f64());
  const Tensor w = param({2, 5}, 3);
  backward(mul(mse_loss(linear(x, w), t), 1.0));
  const std::vector<double> big = values(w.grad());
  w.grad() = Tensor();
  const std::vector<double> xv = x.to_vector<double>(), tv = t.to_vector<double>();
  for (int half = 0; half < 2; ++half) {
    const Tensor xh = from_vector(
        std::vector<double>(xv.begin() + 20 * half, xv.begin() + 20 * half + 20), {4, 5});
    const Tensor th =
        from_vector(std::vector<double>(tv.begin() + 8 * half, tv.begin() + 8 * half + 8), {4, 2});
    // mean over 4 rows each: halve to match the mean over all 8
    backward(mul(mse_loss(linear(xh, w), th), 0.5),
             {.grad_write = half == 0 ? GradWrite::kOverwrite : GradWrite::kAccumulate});
  }
  EXPECT_LT(rel_error(values(w.grad()), big), 1e-14);
}

TEST(AutogradCpu, TimingsAreACudaFeatureAndStayEmptyOnTheCpu) {
  const Tensor w = param({3}, 1);
  std::vector<StepTiming> trace{{0, 0, "stale", 1, 2}};
  backward(sum(mul(w, 2.0)), {.timings = &trace});
  EXPECT_EQ(trace.size(), 1u) << "the CPU backend does not touch the trace";
  EXPECT_EQ(testing::values(w.grad()), std::vector<double>(3, 2.0));
}

TEST(AutogradCpu, LeafRootGetsItsSeed) {
  const Tensor w = param({2}, 1);
  backward({w}, {from_vector(std::vector<double>{3, 4}, {2})});
  EXPECT_EQ(values(w.grad()), (std::vector<double>{3, 4}));
}

TEST(AutogradCpu, NodesRecordInputMetadataAndStreams) {
  const Tensor x = randn({2, 3}, 1, f64());
  const Tensor w = param({4, 3}, 2), b = param({4}, 3);
  const Tensor y = linear(x, w, b);
  const std::shared_ptr<Node>& n = y.grad_fn();
  ASSERT_TRUE(n);
  EXPECT_EQ(n->name(), "linear");
  EXPECT_EQ(n->device(), Device::cpu());
  EXPECT_EQ(n->stream(), nullptr);
  ASSERT_EQ(n->inputs().size(), 3u);
  EXPECT_EQ(n->inputs()[0].shape, Shape({2, 3}));
  EXPECT_FALSE(n->inputs()[0].edge.valid()) << "x does not require grad";
  EXPECT_TRUE(n->inputs()[1].edge.leaf.is_same(w));
  EXPECT_EQ(n->inputs()[2].dtype, DType::kFloat64);
  EXPECT_EQ(n->output_shape(), Shape({2, 4}));
  const Tensor z = relu(y);
  EXPECT_EQ(z.grad_fn()->inputs()[0].edge.node, n);
  EXPECT_GT(z.grad_fn()->sequence_nr(), n->sequence_nr());
}

}  // namespace
}  // namespace graphward
