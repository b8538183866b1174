// Hostile input, by class: what a failing or misused call may leave behind — .grads of the wrong
// type, a backward that runs out of memory part-way, optimizer state, op-level backwards fed what
// their forwards refuse, scalars that overflow float32, two threads on one leaf, a plan that
// outlives its loss, and the inconsistencies PyTorch users would trip on.
#include <cfloat>
#include <optional>
#include <thread>

#include "graphward/base/env.h"
#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::values;

Tensor param(const Shape& shape, std::uint64_t seed) {
  return randn(shape, seed).set_requires_grad(true);
}

// ---- a write the size of the wrong dtype -------------------------------------------------------

// Every optimizer entry point that writes or reads .grads refuses one of another dtype, shape or
// device by name, and writes nothing (zero_grad wrote twice the buffer of a bfloat16 .grad).
TEST(GradOfTheWrongType, EveryOptimizerEntryPointRefusesItByNameAndWritesNothing) {
  const Tensor p = param({4}, 1);
  AdamW opt({p});
  Sgd sgd({p});
  for (const Tensor& bad : {cast(zeros({4}), DType::kBFloat16), zeros({5}), zeros({2, 2}),
                            zeros({4}, {DType::kFloat64}), zeros({4}, {DType::kInt32})}) {
    p.grad() = bad;
    const std::vector<std::uint8_t> before(
        static_cast<const std::uint8_t*>(bad.raw_data()),
        static_cast<const std::uint8_t*>(bad.raw_data()) + bad.nbytes());
    const std::vector<double> p_before = values(p);
    GW_EXPECT_ERROR(opt.zero_grad(), "AdamW", "parameter 0", ".grad", bad.str());
    GW_EXPECT_ERROR(opt.step(), "AdamW", ".grad", bad.str());
    GW_EXPECT_ERROR(sgd.zero_grad(), "Sgd", ".grad");
    GW_EXPECT_ERROR(clip_grad_norm({p}, 1.0), "clip_grad_norm", ".grad");
    EXPECT_EQ(
        std::vector<std::uint8_t>(static_cast<const std::uint8_t*>(bad.raw_data()),
                                  static_cast<const std::uint8_t*>(bad.raw_data()) + bad.nbytes()),
        before);
    EXPECT_EQ(values(p), p_before);
  }
  p.grad() = ones({4});
  opt.zero_grad();  // usable after
  EXPECT_EQ(values(p.grad()), std::vector<double>(4, 0.0));
}

// No CPU kernel takes a dtype it does not compute in: an op given int32 tensors on the CPU
// refuses them, and bfloat16 ones where it has no bfloat16 path, for every op that takes a tensor.
TEST(GradOfTheWrongType, CpuOpsRefuseTypesTheyDoNotComputeIn) {
  const Tensor i = zeros({2, 2}, {DType::kInt32});
  GW_EXPECT_ERROR(add(i, i), "add");
  GW_EXPECT_ERROR(mul(i, 2.0), "mul");
  GW_EXPECT_ERROR(relu(i), "relu");
  GW_EXPECT_ERROR(softmax(i), "softmax");
  Tensor g;
  GW_EXPECT_ERROR(scale_backward(i, 1.0, {&g}), "scale_backward");
  EXPECT_FALSE(g.defined());
  GW_EXPECT_ERROR(matmul(i, i), "matmul");
  GW_EXPECT_ERROR(narrow(i, 0, 1), "narrow");
  GW_EXPECT_ERROR(transpose(i, 0, 1), "transpose");
  // int32: refused by every op that computes (bfloat16 every op takes: Note [bfloat16 on the
  // CPU]).
  const Tensor xi = zeros({2, 2}, {DType::kInt32});
  GW_EXPECT_ERROR(sum(xi), "sum");
  GW_EXPECT_ERROR(layer_norm(xi, zeros({2}, {DType::kInt32}), Tensor()), "layer_norm");
  const Tensor image = zeros({1, 1, 4, 4}, {DType::kInt32});
  GW_EXPECT_ERROR(conv2d(image, zeros({1, 1, 3, 3}, {DType::kInt32})), "conv2d", "int32");
  GW_EXPECT_ERROR(max_pool2d(image), "max_pool2d", "int32");
  GW_EXPECT_ERROR(avg_pool2d(image), "avg_pool2d", "int32");
}

// ---- out of memory, on the CPU, and in the middle of a backward
// ----------------------------------

class HostMemoryLimit : public ::testing::Test {
 protected:
  void SetUp() override { limit_ = host_memory_limit(); }
  void TearDown() override { set_host_memory_limit(limit_); }
  std::size_t limit_ = 0;
};

TEST_F(HostMemoryLimit, EveryHostAllocationFailureIsAnOutOfMemoryError) {
  set_host_memory_limit(host_bytes_in_use() + 4096);
  EXPECT_THROW(zeros({100000}), OutOfMemoryError);
  EXPECT_THROW(randn({100000}, 1), OutOfMemoryError);
  EXPECT_THROW(from_vector(std::vector<float>(100000, 1.f), {100000}), OutOfMemoryError);
  const Tensor small = ones({8});
  EXPECT_THROW(matmul(ones({1, 8}), ones({8, 100000 / 8 * 8})), OutOfMemoryError);
  try {
    (void)zeros({100000});
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of host memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("400000 bytes"), std::string::npos) << e.what();
  }
  // Past the address space (no limit): refused by the system, the same error.
  set_host_memory_limit(SIZE_MAX);
  EXPECT_THROW(zeros({std::int64_t{1} << 50}), OutOfMemoryError);
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(8, 1.f));
}

// A two-branch model whose backward needs memory step by step: with the limit set so that it runs
// out part-way, at every possible point, the backward fails with OutOfMemoryError saying where;
// the .grads it made are undefined again; what it freed it says, and a backward through a freed
// node is refused naming the failed backward. With the memory back, a backward of the same tape
// (when nothing was freed) or of a new forward gives the gradients of an undisturbed backward.
TEST_F(HostMemoryLimit, ABackwardThatRunsOutPartWaySaysWhatItLeftAndUndoesItsNewGrads) {
  const Tensor w1 = param({64, 64}, 2), w2 = param({64, 64}, 3), b = param({64}, 4);
  const Tensor x = randn({32, 64}, 5);
  auto forward = [&] { return sum(mul(relu(linear(x, w1, b)), relu(linear(x, w2)))); };
  const std::vector<const Tensor*> params{&w1, &w2, &b};
  std::vector<std::vector<double>> reference;
  {
    const Tensor loss = forward();
    backward(loss);
    for (const Tensor* p : params) reference.push_back(values(p->grad()));
    for (const Tensor* p : params) p->grad() = Tensor();
  }
  int whole = 0, freed = 0;
  for (std::size_t room = 0; room < (std::size_t{256} << 10); room += 1024) {
    Tensor loss = forward();
    set_host_memory_limit(host_bytes_in_use() + room);
    bool failed = false;
    try {
      backward(loss);
    } catch (const OutOfMemoryError& e) {
      failed = true;
      const std::string what = e.what();
      for (const Tensor* p : params) EXPECT_FALSE(p->grad().defined()) << what;
      set_host_memory_limit(SIZE_MAX);
      if (what.find("Nothing was released") != std::string::npos) {
        ++whole;  // the tape is whole: the same backward runs
      } else if (what.find("were freed as it went: run the forward again") != std::string::npos) {
        ++freed;
        GW_EXPECT_ERROR(backward(loss), "a second time", "failed part-way",
                        "run the forward again");
        for (const Tensor* p : params) EXPECT_FALSE(p->grad().defined());
        loss = forward();
      } else {
        // Before the executor began (the seeds): nothing was written or freed.
        EXPECT_EQ(what.find("[the backward failed"), std::string::npos) << what;
      }
      backward(loss);
    }
    set_host_memory_limit(SIZE_MAX);
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(values(params[i]->grad()), reference[i]) << "room " << room;
      params[i]->grad() = Tensor();
    }
    if (!failed) break;  // enough room for the whole backward
  }
  EXPECT_GT(whole, 0);
  EXPECT_GT(freed, 3);
}

// .grads that existed before: the error names those the backward already wrote into.
TEST_F(HostMemoryLimit, ABackwardThatFailsAfterWritingExistingGradsNamesThem) {
  const Tensor w = param({64, 64}, 6), x = randn({8, 64}, 7);
  const Tensor loss = sum(relu(matmul(relu(matmul(x, w)), w)));
  int named = 0, untouched = 0;
  for (std::size_t room = 0; room < (std::size_t{128} << 10); room += 1024) {
    w.grad() = zeros({64, 64});
    const Tensor grad = w.grad();
    set_host_memory_limit(host_bytes_in_use() + room);
    try {
      backward(loss, {.retain_graph = true});
      set_host_memory_limit(SIZE_MAX);
      break;
    } catch (const OutOfMemoryError& e) {
      set_host_memory_limit(SIZE_MAX);
      const std::string what = e.what();
      EXPECT_TRUE(w.grad().is_same(grad)) << what;  // an existing .grad is kept, never replaced
      if (what.find("already hold part of this backward's gradient: float32[64, 64]") !=
          std::string::npos) {
        ++named;
      } else if (what.find("[the backward failed") == std::string::npos) {
        EXPECT_EQ(values(w.grad()), std::vector<double>(64 * 64, 0.0)) << what;  // before it began
      } else {
        EXPECT_NE(what.find("No .grad that existed before was written"), std::string::npos) << what;
        EXPECT_EQ(values(w.grad()), std::vector<double>(64 * 64, 0.0)) << what;
        ++untouched;
      }
    }
  }
  EXPECT_GT(named, 0);  // the second matmul's weight gradient is written before the first's
  EXPECT_GT(untouched, 0);
  w.grad() = zeros({64, 64});
  backward(loss);  // whole: runs
}

// ---- optimizer state per parameter --------------------------------------------------------------

// AdamW's first update of a parameter is lr · sign(g) whatever came before: steps in which no
// parameter had a gradient, or in which only others had one, do not count for it (PyTorch counts
// per parameter).
TEST(OptimizerState, StepCountsArePerParameterAndSkipParametersWithoutAGradient) {
  const Tensor p = from_vector(std::vector<double>{1.0}, {1}).set_requires_grad(true);
  const Tensor q = from_vector(std::vector<double>{1.0}, {1}).set_requires_grad(true);
  AdamW opt({p, q}, {.lr = 0.1, .weight_decay = 0});
  opt.step();  // no gradient anywhere: nothing counts
  opt.step();
  EXPECT_EQ(opt.steps(), 0);
  q.grad() = from_vector(std::vector<double>{1.0}, {1});
  for (int i = 0; i < 1000; ++i) opt.step();  // q trains, p is frozen
  EXPECT_EQ(opt.steps(0), 0);
  EXPECT_EQ(opt.steps(1), 1000);
  EXPECT_EQ(opt.steps(), 1000);
  p.grad() = from_vector(std::vector<double>{1.0}, {1});
  opt.step();                                  // p's first step: bias-corrected, exactly lr
  EXPECT_NEAR(values(p)[0], 1.0 - 0.1, 1e-8);  // shared counts gave 1 - 0.25
  EXPECT_EQ(opt.steps(0), 1);
  EXPECT_EQ(opt.steps(1), 1001);
  GW_EXPECT_ERROR(opt.steps(2), "AdamW::steps", "parameter 2");
  // SGD with momentum: a parameter's first step sets its buffer, whatever others did.
  const Tensor r = from_vector(std::vector<double>{0.0}, {1}).set_requires_grad(true);
  const Tensor s = from_vector(std::vector<double>{0.0}, {1}).set_requires_grad(true);
  Sgd sgd({r, s}, {.lr = 1, .momentum = 0.9, .dampening = 0.5});
  s.grad() = from_vector(std::vector<double>{1.0}, {1});
  sgd.step();
  r.grad() = from_vector(std::vector<double>{1.0}, {1});
  sgd.step();  // r's first: buf = g (no dampening applied), r = -1
  EXPECT_DOUBLE_EQ(values(r)[0], -1.0);
  EXPECT_DOUBLE_EQ(values(s)[0], -1.0 - (0.9 * 1.0 + 0.5 * 1.0));
}

TEST(OptimizerState, ParametersAreDistinctLeaves) {
  const Tensor p = param({3}, 8);
  GW_EXPECT_ERROR(AdamW({p, p}), "AdamW", "parameters 0 and 1", "same tensor");
  GW_EXPECT_ERROR(Sgd({p, p.detach()}), "Sgd", "parameters 0 and 1");
  const Tensor nonleaf = mul(p, 2.0);
  GW_EXPECT_ERROR(AdamW({nonleaf}), "AdamW", "parameter 0", "recorded op", "mul#", "leaf");
}

// ---- scalars finite as double, infinite as float32
// ------------------------------------------------

TEST(FloatRange, ScalarsThatOverflowTheTensorsTypeAreRefused) {
  const Tensor x = ones({2});
  GW_EXPECT_ERROR(mul(x, 1e39), "mul", "1e+39", "infinite as float32");
  GW_EXPECT_ERROR(add(x, -1e39), "add", "infinite as float32");
  GW_EXPECT_ERROR(sub(x, DBL_MAX), "sub");
  Tensor g;
  GW_EXPECT_ERROR(scale_backward(x, 1e39, {&g}), "scale_backward");
  GW_EXPECT_ERROR(add_(x, x, 1e39), "add_");
  GW_EXPECT_ERROR(layer_norm(ones({2, 2}), ones({2}), Tensor(), 1e39), "layer_norm");
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(2, 1.f));
  GW_EXPECT_ERROR(full({2}, 1e39), "full", "infinite as float32");
  GW_EXPECT_ERROR(full({2}, -1e39, {DType::kBFloat16}), "full", "infinite as bfloat16");
  GW_EXPECT_ERROR(uniform({2}, -1e39, 0, 1), "uniform", "infinite as float32");
  EXPECT_TRUE(std::isinf(full({1}, INFINITY).item()));  // asked for: given
  // float64 tensors take them: finite there.
  EXPECT_EQ(mul(ones({1}, {DType::kFloat64}), 1e39).to_vector<double>()[0], 1e39);
  const Tensor p = param({2}, 9);
  GW_EXPECT_ERROR(Sgd({p}, {.lr = 1e39}), "Sgd", "lr", "infinite as float32");
  GW_EXPECT_ERROR(AdamW({p}, {.eps = 1e39}), "AdamW", "eps");
  Sgd ok({p}, {.lr = 0.1});
  GW_EXPECT_ERROR(ok.set_lr(1e39), "Sgd", "lr");
  EXPECT_EQ(ok.lr(), 0.1);
  p.grad() = ones({2});
  GW_EXPECT_ERROR(clip_grad_norm({p}, 1e39), "clip_grad_norm", "max_norm");
}

// ---- op-level backwards check what their forwards check
// ------------------------------------------

TEST(OpLevelBackward, TargetsAndIdsOutOfRangeAreRefusedAsInTheForward) {
  const Tensor logits = randn({2, 3}, 10), lse = ones({2, 2}), g = ones({});
  for (std::int32_t bad : {-1, 3, INT32_MAX, INT32_MIN}) {
    const Tensor targets = from_vector(std::vector<std::int32_t>{0, bad}, {2});
    GW_EXPECT_ERROR(cross_entropy(logits, targets), "cross_entropy", "target 1");
    Tensor gl;
    GW_EXPECT_ERROR(cross_entropy_backward(g, logits, lse, targets, {&gl}),
                    "cross_entropy_backward", "target 1", "[0, 3)");
    EXPECT_FALSE(gl.defined());
    const Tensor table = randn({3, 2}, 11), ids = from_vector(std::vector<std::int32_t>{bad}, {1});
    GW_EXPECT_ERROR(embedding(table, ids), "embedding", "id 0");
    Tensor gt = zeros({3, 2});
    GW_EXPECT_ERROR(embedding_backward(ones({1, 2}), table, ids, {&gt, true}), "embedding_backward",
                    "id 0", "[0, 3)");
    EXPECT_EQ(gt.to_vector<float>(), std::vector<float>(6, 0.f));
  }
}

// ---- two threads, one leaf --------------------------------------------------------------------

// Eight threads, each running 200 backwards of its own graphs over one shared weight: every
// contribution arrives (the claims serialize the accumulations).
TEST(SharedLeaf, ConcurrentBackwardsOverOneLeafLoseNoContribution) {
  const Tensor w = zeros({64, 64}).set_requires_grad(true);
  const Tensor b = zeros({64}).set_requires_grad(true);
  constexpr int kThreads = 8, kSteps = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Tensor x = ones({4, 64});
      for (int s = 0; s < kSteps; ++s) backward(sum(linear(x, w, b)));
      (void)t;
    });
  }
  for (std::thread& th : threads) th.join();
  // d sum(x·wᵀ + b) / dw = Σ_rows x = 4 per element; / db = 4.
  EXPECT_EQ(values(w.grad()), std::vector<double>(64 * 64, 4.0 * kThreads * kSteps));
  EXPECT_EQ(values(b.grad()), std::vector<double>(64, 4.0 * kThreads * kSteps));
}

// Two threads whose graphs reach two shared leaves in opposite orders never wait on each other.
TEST(SharedLeaf, BackwardsReachingSharedLeavesInOppositeOrdersDoNotDeadlock) {
  const Tensor u = zeros({8}).set_requires_grad(true), v = zeros({8}).set_requires_grad(true);
  auto run = [&](bool uv) {
    for (int s = 0; s < 500; ++s) {
      const Tensor y = uv ? add(mul(u, 2.0), v) : add(mul(v, 2.0), u);
      backward(sum(y));
    }
  };
  std::thread a(run, true), c(run, false);
  a.join();
  c.join();
  EXPECT_EQ(values(u.grad()), std::vector<double>(8, 1500.0));
  EXPECT_EQ(values(v.grad()), std::vector<double>(8, 1500.0));
}

// ---- a plan outlives its loss ------------------------------------------------------------------

TEST(PlanLifetime, APlanKeptAfterItsLossDiedStillDescribesAndRunsItsTape) {
  const Tensor w = param({4, 4}, 12);
  BackwardPlan plan;
  const std::size_t nodes_before = debug::live_nodes();
  {
    const Tensor loss = sum(relu(matmul(randn({2, 4}, 13), w)));
    plan = plan_for({loss});
  }  // the loss is gone; the plan keeps its nodes
  EXPECT_GT(debug::live_nodes(), nodes_before);
  EXPECT_NE(plan.dump().find("sum"), std::string::npos);
  EagerExecutor executor;
  executor.run(plan, {ones({})}, Device::cpu());
  EXPECT_TRUE(w.grad().defined());
  plan = BackwardPlan();
  EXPECT_EQ(debug::live_nodes(), nodes_before);
}

// ---- spurious errors and inconsistencies
// ---------------------------------------------------------

// sum, mean, add and sub need only their inputs' shapes: an input written in place after them does
// not fail the backward (PyTorch runs it too).
TEST(Consistency, OpsThatNeedOnlyShapesDoNotRefuseAnInputWrittenInPlace) {
  const Tensor x = param({2, 3}, 14), row = param({3}, 15);
  const Tensor a = mul(x, 1.0), r = mul(row, 1.0);
  const Tensor loss = add(add(sum(a), mean(a)), sum(sub(add(a, r), r)));
  {
    NoGradGuard no_grad;
    add_(a, ones({2, 3}));  // in place, after the ops read it
    add_(r, ones({3}));
  }
  backward(loss);
  for (double g : values(x.grad())) EXPECT_NEAR(g, 1.0 + 1.0 / 6.0 + 1.0, 1e-6);
  EXPECT_EQ(values(row.grad()), std::vector<double>(3, 0.0));
}

TEST(Consistency, BroadcastingARowAndA1ByNRowGivesOneShapeInEitherOrder) {
  const Tensor a = ones({3}), b = ones({1, 3});
  EXPECT_EQ(add(a, b).shape(), Shape({1, 3}));
  EXPECT_EQ(add(b, a).shape(), Shape({1, 3}));
  EXPECT_EQ(mul(a, b).shape(), Shape({1, 3}));
  EXPECT_EQ(sub(b, a).shape(), Shape({1, 3}));
  const Tensor pa = param({3}, 16), pb = param({1, 3}, 17);
  backward(sum(mul(pa, pb)));
  EXPECT_EQ(pa.grad().shape(), Shape({3}));
  EXPECT_EQ(pb.grad().shape(), Shape({1, 3}));
}

TEST(Consistency, ClipGradNormWithANanGradientMakesEveryGradientNan) {
  const Tensor p = param({2}, 18), q = param({2}, 19);
  p.grad() = from_vector(std::vector<float>{NAN, 1.f}, {2});
  q.grad() = from_vector(std::vector<float>{3.f, 4.f}, {2});
  const Tensor norm = clip_grad_norm({p, q}, 1.0);
  EXPECT_TRUE(std::isnan(norm.item()));
  for (float v : q.grad().to_vector<float>()) EXPECT_TRUE(std::isnan(v));
}

TEST(Consistency, UndefinedRootsAndLossesAreRefusedByName) {
  const Tensor x = param({2}, 20);
  GW_EXPECT_ERROR(backward(std::vector<Tensor>{sum(x), Tensor()}), "backward", "root 1 of 2",
                  "undefined");
  GW_EXPECT_ERROR(backward(Tensor()), "backward", "root 0", "undefined");
  GW_EXPECT_ERROR(plan_for({Tensor()}), "backward", "root 0", "undefined");
  StepGraph graph(Device::cpu());
  GW_EXPECT_ERROR(graph.run([] { return Tensor(); }), "StepGraph", "nothing", "loss");
  EXPECT_FALSE(x.grad().defined());
}

// ---- switches from the environment ----------------------------------------------------------

// One parser for every switch graphward reads from the environment (base/env.h): the usual words
// for on and off in any case, unset or empty for the default, anything else an error naming the
// variable ("false", "off" and "no" turned GRAPHWARD_LOCALIZE_FAULTS, GRAPHWARD_POISON and
// GRAPHWARD_GEMM_TUNING on).
TEST(EnvironmentSwitches, EveryWordForOnAndOffIsReadAndAnythingElseIsRefusedByName) {
  for (const char* on : {"1", "true", "on", "yes", "TRUE", "On", "Yes"}) {
    EXPECT_EQ(detail::parse_env_switch("GRAPHWARD_X", on), std::optional<bool>(true)) << on;
  }
  for (const char* off : {"0", "false", "off", "no", "FALSE", "Off", "NO"}) {
    EXPECT_EQ(detail::parse_env_switch("GRAPHWARD_X", off), std::optional<bool>(false)) << off;
  }
  EXPECT_EQ(detail::parse_env_switch("GRAPHWARD_X", ""), std::nullopt);
  for (const char* bad : {"2", "maybe", "truee", " 1", "1 ", "-1", "y", "enable"}) {
    GW_EXPECT_ERROR(detail::parse_env_switch("GRAPHWARD_POISON", bad), "GRAPHWARD_POISON",
                    std::string("'") + bad + "'", "expected 1, true, on or yes");
  }
}

}  // namespace
}  // namespace graphward
