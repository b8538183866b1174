// Optimizers on the CPU backend: SGD (momentum, dampening, Nesterov, weight decay) and AdamW
// against the formulas of torch.optim written out here in double, the device-held learning rate
// and step count, zero_grad keeping the buffers, gradient clipping, bad input, and a small MLP
// (linear + GELU layers) trained with each.
#include <cmath>
#include <memory>
#include <string>

#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::values;

Tensor param(const Shape& s, std::uint64_t seed) {
  return randn(s, seed, f64()).set_requires_grad(true);
}

// Sets p's .grad to the values of `g` (a fresh tensor each call, as a backward writes).
void set_grad(const Tensor& p, const std::vector<double>& g) {
  p.grad() = from_vector(g, p.shape(), p.device());
}

std::vector<double> grads_for(int step, std::size_t n) {
  std::vector<double> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(1.0 + i + 3.0 * step) * (i % 2 ? 2.0 : 0.5);
  return g;
}

TEST(OptimCpu, SgdFollowsTorchOptimSgdForEveryOption) {
  struct Case {
    SgdOptions o;
  };
  const SgdOptions cases[] = {{.lr = 0.1},
                              {.lr = 0.1, .weight_decay = 0.01},
                              {.lr = 0.05, .momentum = 0.9},
                              {.lr = 0.05, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.1},
                              {.lr = 0.05, .momentum = 0.9, .nesterov = true}};
  for (const SgdOptions& o : cases) {
    const Tensor p = param({7}, 1);
    std::vector<double> want = values(p), buf(7, 0.0);
    Sgd opt({p}, o);
    for (int s = 0; s < 4; ++s) {
      const std::vector<double> g0 = grads_for(s, 7);
      set_grad(p, g0);
      opt.step();
      for (std::size_t i = 0; i < 7; ++i) {
        double g = g0[i] + o.weight_decay * want[i];
        if (o.momentum != 0) {
          buf[i] = s == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
          g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
        }
        want[i] -= o.lr * g;
      }
    }
    const std::vector<double> got = values(p);
    for (std::size_t i = 0; i < 7; ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-12)
          << "momentum " << o.momentum << " nesterov " << o.nesterov;
    }
    EXPECT_EQ(opt.steps(), 4);
  }
}

TEST(OptimCpu, AdamWFollowsTorchOptimAdamW) {
  const AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  const Tensor p = param({5}, 2), q = param({2, 3}, 3);
  std::vector<double> wp = values(p), mp(5, 0), vp(5, 0);
  AdamW opt({p, q}, o);
  for (int s = 0; s < 5; ++s) {
    const std::vector<double> g = grads_for(s, 5);
    set_grad(p, g);
    set_grad(q, grads_for(s, 6));
    opt.step();
    const double t = s + 1;
    for (std::size_t i = 0; i < 5; ++i) {
      wp[i] *= 1 - o.lr * o.weight_decay;
      mp[i] = o.beta1 * mp[i] + (1 - o.beta1) * g[i];
      vp[i] = o.beta2 * vp[i] + (1 - o.beta2) * g[i] * g[i];
      const double mhat = mp[i] / (1 - std::pow(o.beta1, t));
      const double denom = std::sqrt(vp[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      wp[i] -= o.lr * mhat / denom;
    }
  }
  const std::vector<double> got = values(p);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], wp[i], 1e-12);
  EXPECT_EQ(opt.steps(), 5);
}

TEST(OptimCpu, TheLearningRateAndTheStepCountLiveWithTheParameters) {
  const Tensor p = param({3}, 4);
  Sgd opt({p}, {.lr = 0.5});
  EXPECT_EQ(opt.lr(), 0.5);
  opt.set_lr(0.25);
  EXPECT_EQ(opt.lr(), 0.25);
  const std::vector<double> before = values(p);
  set_grad(p, {1, 2, 4});
  opt.step();
  EXPECT_EQ(values(p), (std::vector<double>{before[0] - 0.25, before[1] - 0.5, before[2] - 1.0}));
  // A parameter without a .grad is skipped; the step still counts.
  const Tensor q = param({2}, 5);
  Sgd opt2({p, q}, {.lr = 1});
  p.grad() = Tensor();
  const std::vector<double> pq = values(q);
  q.grad() = from_vector(std::vector<double>{1, 1}, {2});
  opt2.step();
  EXPECT_EQ(values(q), (std::vector<double>{pq[0] - 1, pq[1] - 1}));
  EXPECT_EQ(opt2.steps(), 1);
}

// Note [Learning-rate schedule]: llm.c's get_learning_rate written out — warm-up (t + 1) / warmup,
// then cosine to final_lr_fraction · lr at total_steps, held after.
TEST(OptimCpu, AScheduledLearningRateIsLlmcsWarmUpAndCosineDecay) {
  const Tensor p = param({3}, 6);
  const double peak = 6e-4, low = 0.1 * peak;
  AdamW opt({p}, {.lr = peak,
                  .schedule = LrSchedule{.warmup_steps = 10, .total_steps = 110,
                                         .final_lr_fraction = 0.1}});
  for (std::int64_t t : {0, 3, 9}) EXPECT_DOUBLE_EQ(opt.lr_at(t), peak * (t + 1) / 10.0) << t;
  EXPECT_DOUBLE_EQ(opt.lr_at(10), peak);
  for (std::int64_t t : {10, 35, 60, 85, 109}) {
    const double r = (t - 10) / 100.0;
    EXPECT_NEAR(opt.lr_at(t), low + 0.5 * (1 + std::cos(M_PI * r)) * (peak - low), 1e-18) << t;
  }
  EXPECT_NEAR(opt.lr_at(60), 0.5 * (peak + low), 1e-18);
  EXPECT_DOUBLE_EQ(opt.lr_at(110), low);
  EXPECT_DOUBLE_EQ(opt.lr_at(5000), low);
  EXPECT_EQ(opt.lr(), peak) << "lr() is the peak";
  opt.set_lr(2 * peak);
  EXPECT_DOUBLE_EQ(opt.lr_at(5), 2 * peak * 6 / 10.0) << "set_lr moves the peak";
  AdamW plain({p}, {.lr = peak});
  EXPECT_EQ(plain.lr_at(0), peak);
  EXPECT_EQ(plain.lr_at(12345), peak);
  GW_EXPECT_ERROR(plain.lr_at(-1), "AdamW::lr_at", "step -1");
}

// The scheduled steps are the steps an unscheduled optimizer takes with set_lr(lr_at(t)) before
// each: bitwise, for SGD with momentum and for AdamW, parameter by parameter — a parameter without
// a gradient for a while keeps its count, and its schedule with it.
TEST(OptimCpu, ScheduledStepsAreStepsAtTheScheduledRateEachParameterAtItsOwnCount) {
  const LrSchedule sched{.warmup_steps = 3, .total_steps = 9, .final_lr_fraction = 0.2};
  for (int which = 0; which < 2; ++which) {
    const std::vector<Tensor> a{param({5}, 7), param({4}, 8)}, b{param({5}, 7), param({4}, 8)};
    std::unique_ptr<Optimizer> scheduled, manual;
    if (which == 0) {
      scheduled = std::make_unique<Sgd>(a, SgdOptions{.lr = 0.1, .momentum = 0.9, .schedule = sched});
      manual = std::make_unique<Sgd>(std::vector<Tensor>{b[0]}, SgdOptions{.lr = 0.1, .momentum = 0.9});
    } else {
      scheduled = std::make_unique<AdamW>(a, AdamWOptions{.lr = 0.1, .schedule = sched});
      manual = std::make_unique<AdamW>(std::vector<Tensor>{b[0]}, AdamWOptions{.lr = 0.1});
    }
    std::unique_ptr<Optimizer> manual1 =
        which == 0 ? std::unique_ptr<Optimizer>(std::make_unique<Sgd>(
                         std::vector<Tensor>{b[1]}, SgdOptions{.lr = 0.1, .momentum = 0.9}))
                   : std::make_unique<AdamW>(std::vector<Tensor>{b[1]}, AdamWOptions{.lr = 0.1});
    std::int64_t count1 = 0;
    for (int step = 0; step < 14; ++step) {
      const bool second = step < 2 || step > 6;  // the second parameter frozen for steps 2..6
      set_grad(a[0], grads_for(step, 5));
      set_grad(b[0], grads_for(step, 5));
      if (second) {
        set_grad(a[1], grads_for(step + 50, 4));
        set_grad(b[1], grads_for(step + 50, 4));
      } else {
        a[1].grad() = Tensor();
      }
      scheduled->step();
      manual->set_lr(scheduled->lr_at(step));
      manual->step();
      if (second) {
        manual1->set_lr(scheduled->lr_at(count1++));
        manual1->step();
      }
      ASSERT_EQ(values(a[0]), values(b[0])) << which << " step " << step;
      ASSERT_EQ(values(a[1]), values(b[1])) << which << " step " << step;
    }
    EXPECT_EQ(scheduled->steps(1), count1);
  }
}

TEST(OptimCpu, ABadScheduleIsRefusedByName) {
  const Tensor p = param({3}, 9);
  GW_EXPECT_ERROR(AdamW({p}, {.schedule = LrSchedule{.warmup_steps = -1, .total_steps = 10}}),
                  "AdamW", "-1 warm-up steps in 10", "0 <= warmup_steps < total_steps");
  GW_EXPECT_ERROR(AdamW({p}, {.schedule = LrSchedule{.warmup_steps = 10, .total_steps = 10}}),
                  "AdamW", "10 warm-up steps in 10");
  GW_EXPECT_ERROR(Sgd({p}, {.schedule = LrSchedule{.total_steps = 0}}), "Sgd", "in 0");
  GW_EXPECT_ERROR(AdamW({p}, {.schedule = LrSchedule{.total_steps = (std::int64_t{1} << 53) + 1}}),
                  "AdamW", "2^53");
  for (double f : {-0.1, 1.5, std::nan("")}) {
    GW_EXPECT_ERROR(
        AdamW({p}, {.schedule = LrSchedule{.total_steps = 10, .final_lr_fraction = f}}), "AdamW",
        "final_lr_fraction", "in [0, 1]");
  }
}

// Optimizer::state(): the live tensors a checkpoint saves, by name.
TEST(OptimCpu, StateNamesEveryTensorAStepReadsBesidesTheParameters) {
  const Tensor a = param({3}, 10), b = param({2, 2}, 11);
  auto names = [](const Optimizer& o) {
    std::vector<std::string> n;
    for (const auto& [name, t] : o.state()) n.push_back(name);
    return n;
  };
  AdamW adamw({a, b});
  EXPECT_EQ(names(adamw), (std::vector<std::string>{"step", "exp_avg.0", "exp_avg.1",
                                                    "exp_avg_sq.0", "exp_avg_sq.1"}));
  EXPECT_EQ(names(Sgd({a, b}, {.momentum = 0.9})),
            (std::vector<std::string>{"step", "momentum_buffer.0", "momentum_buffer.1"}));
  EXPECT_EQ(names(Sgd({a, b})), (std::vector<std::string>{"step"}));
  const Tensor h = cast(randn({4}, 12), DType::kBFloat16).set_requires_grad(true);
  EXPECT_EQ(names(AdamW({h})),
            (std::vector<std::string>{"step", "exp_avg.0", "exp_avg_sq.0", "master.0"}));
  // Live: a write into a state tensor is what the next step reads.
  set_grad(a, {1, 1, 1});
  set_grad(b, {1, 1, 1, 1});
  adamw.step();
  EXPECT_EQ(values(adamw.state()[0].second), (std::vector<double>{1, 1}));
}

TEST(OptimCpu, ZeroGradWritesZerosIntoTheSameBuffers) {
  const Tensor p = param({4}, 6);
  set_grad(p, {1, 2, 3, 4});
  const void* where = p.grad().raw_data();
  const auto version = p.grad().version();
  Sgd opt({p});
  opt.zero_grad();
  EXPECT_EQ(p.grad().raw_data(), where);
  EXPECT_EQ(values(p.grad()), std::vector<double>(4, 0.0));
  EXPECT_GT(p.grad().version(), version);
  const Tensor q = param({2}, 7);  // no .grad: stays undefined
  Sgd opt2({q});
  opt2.zero_grad();
  EXPECT_FALSE(q.grad().defined());
}

TEST(OptimCpu, ClipGradNormScalesToTheMaximumAndReturnsTheNorm) {
  const Tensor p = param({2}, 8), q = param({2}, 9);
  set_grad(p, {3, 0});
  set_grad(q, {0, 4});  // global norm 5
  const Tensor norm = clip_grad_norm({p, q}, 1.0);
  EXPECT_EQ(norm.shape(), Shape({}));
  EXPECT_NEAR(norm.item(), 5.0, 1e-12);
  const double c = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(values(p.grad())[0], 3 * c, 1e-12);
  EXPECT_NEAR(values(q.grad())[1], 4 * c, 1e-12);
  // Below the maximum: unchanged.
  set_grad(p, {0.3, 0});
  set_grad(q, {0, 0.4});
  EXPECT_NEAR(clip_grad_norm({p, q}, 1.0).item(), 0.5, 1e-12);
  EXPECT_EQ(values(p.grad()), (std::vector<double>{0.3, 0}));
}

TEST(OptimCpu, BadInputIsRefusedByName) {
  const Tensor p = param({3}, 10);
  GW_EXPECT_ERROR(Sgd(std::vector<Tensor>{}, {}), "Sgd", "at least one parameter");
  GW_EXPECT_ERROR(AdamW(std::vector<ParamGroup>{{}, {}}, {}), "AdamW", "at least one parameter");
  GW_EXPECT_ERROR(Sgd({p}, {.lr = -1}), "Sgd", "lr", "-1");
  GW_EXPECT_ERROR(Sgd({p}, {.lr = 0.1, .momentum = 0, .nesterov = true}), "Sgd", "nesterov");
  GW_EXPECT_ERROR(AdamW({p}, {.beta1 = 1.0}), "AdamW", "betas");
  GW_EXPECT_ERROR(AdamW({p}, {.eps = 0}), "AdamW", "eps");
  GW_EXPECT_ERROR(Sgd({p, randn({2}, 1)}, {}), "Sgd", "parameter 1", "one device and one dtype");
  GW_EXPECT_ERROR(clip_grad_norm({p}, 0.0), "clip_grad_norm", "max_norm");
  // A .grad of the wrong shape: the step refuses and writes nothing.
  Sgd opt({p}, {.lr = 1});
  const std::vector<double> before = values(p);
  p.grad() = zeros({4}, f64());
  GW_EXPECT_ERROR(opt.step(), "Sgd", ".grad", "[4]");
  EXPECT_EQ(values(p), before);
  EXPECT_EQ(opt.steps(), 0);
}

// Parameter groups: each parameter decays with its group's weight decay (else the optimizer's),
// bitwise as an optimizer of that weight decay alone would step it; decay_matrices_only decays the
// matrices and not the vectors; a group's bad weight decay, and a parameter in two groups, are
// refused by name.
TEST(OptimCpu, ParameterGroupsStepEachParameterWithItsGroupsWeightDecay) {
  for (bool adamw : {false, true}) {
    const Tensor w = param({3, 4}, 60), b = param({4}, 61), g = param({4}, 62);
    const Tensor w1 = param({3, 4}, 60), b1 = param({4}, 61), g1 = param({4}, 62);
    std::unique_ptr<Optimizer> grouped, decayed, plain, other;
    if (adamw) {
      grouped =
          std::make_unique<AdamW>(std::vector<ParamGroup>{{.params = {w}},
                                                          {.params = {b}, .weight_decay = 0.0},
                                                          {},
                                                          {.params = {g}, .weight_decay = 0.3}},
                                  AdamWOptions{.lr = 0.1, .weight_decay = 0.05});
      decayed = std::make_unique<AdamW>(std::vector<Tensor>{w1},
                                        AdamWOptions{.lr = 0.1, .weight_decay = 0.05});
      plain = std::make_unique<AdamW>(std::vector<Tensor>{b1},
                                      AdamWOptions{.lr = 0.1, .weight_decay = 0.0});
      other = std::make_unique<AdamW>(std::vector<Tensor>{g1},
                                      AdamWOptions{.lr = 0.1, .weight_decay = 0.3});
    } else {
      const SgdOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05};
      grouped = std::make_unique<Sgd>(std::vector<ParamGroup>{{.params = {w}},
                                                              {.params = {b}, .weight_decay = 0.0},
                                                              {},
                                                              {.params = {g}, .weight_decay = 0.3}},
                                      o);
      decayed = std::make_unique<Sgd>(std::vector<Tensor>{w1}, o);
      SgdOptions none = o, more = o;
      none.weight_decay = 0.0;
      more.weight_decay = 0.3;
      plain = std::make_unique<Sgd>(std::vector<Tensor>{b1}, none);
      other = std::make_unique<Sgd>(std::vector<Tensor>{g1}, more);
    }
    EXPECT_EQ(grouped->params().size(), 3u);
    EXPECT_EQ(grouped->weight_decay(0), 0.05);
    EXPECT_EQ(grouped->weight_decay(1), 0.0);
    EXPECT_EQ(grouped->weight_decay(2), 0.3);
    for (int step = 0; step < 3; ++step) {
      for (const Tensor* t : {&w, &w1}) set_grad(*t, grads_for(step, 12));
      for (const Tensor* t : {&b, &b1, &g, &g1}) set_grad(*t, grads_for(step + 5, 4));
      grouped->step();
      decayed->step();
      plain->step();
      other->step();
      EXPECT_EQ(values(w), values(w1)) << "adamw=" << adamw << " step " << step;
      EXPECT_EQ(values(b), values(b1)) << "adamw=" << adamw << " step " << step;
      EXPECT_EQ(values(g), values(g1)) << "adamw=" << adamw << " step " << step;
    }
  }
  // decay_matrices_only: matrices and filters in the first group (the optimizer's decay), vectors
  // in the second (none), in the order given.
  const Tensor m = param({2, 3}, 70), v = param({3}, 71), f = param({4, 1, 3, 3}, 72),
               v2 = param({2}, 73);
  const std::vector<ParamGroup> groups = decay_matrices_only({m, v, f, v2});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups[0].weight_decay.has_value());
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  ASSERT_EQ(groups[0].params.size(), 2u);
  ASSERT_EQ(groups[1].params.size(), 2u);
  EXPECT_TRUE(groups[0].params[0].is_same(m) && groups[0].params[1].is_same(f));
  EXPECT_TRUE(groups[1].params[0].is_same(v) && groups[1].params[1].is_same(v2));
  const AdamW opt(groups, {.weight_decay = 0.1});
  EXPECT_EQ(opt.weight_decay(0), 0.1);
  EXPECT_EQ(opt.weight_decay(2), 0.0);
  GW_EXPECT_ERROR(opt.weight_decay(4), "AdamW::weight_decay", "parameter 4", "below 4");
  // Refusals: a group's weight decay negative or non-finite; one parameter in two groups.
  GW_EXPECT_ERROR(
      AdamW(std::vector<ParamGroup>{{.params = {m}}, {.params = {v}, .weight_decay = -1}}, {}),
      "AdamW", "weight_decay of group 1", "-1");
  GW_EXPECT_ERROR(Sgd(std::vector<ParamGroup>{{.params = {m}, .weight_decay = NAN}}, {}), "Sgd",
                  "weight_decay of group 0");
  GW_EXPECT_ERROR(AdamW(std::vector<ParamGroup>{{.params = {m, v}}, {.params = {m}}}, {}), "AdamW",
                  "parameters 0 and 2 are the same tensor");
}

// Optimizer::step_params: a subset stepped is stepped as step() steps it, the rest untouched and
// uncounted; an index out of range or listed twice is refused by name, nothing written.
TEST(OptimCpu, StepParamsStepsTheListedParametersAsStepDoes) {
  const Tensor a = param({3}, 30), b = param({4}, 31), a2 = param({3}, 30), b2 = param({4}, 31);
  AdamW some({a, b}, {.lr = 0.1}), all({a2, b2}, {.lr = 0.1});
  set_grad(a, grads_for(0, 3));
  set_grad(b, grads_for(1, 4));
  set_grad(a2, grads_for(0, 3));
  set_grad(b2, grads_for(1, 4));
  const std::vector<double> b_before = values(b);
  some.step_params({0});
  all.step();
  EXPECT_EQ(values(a), values(a2));
  EXPECT_EQ(values(b), b_before);
  EXPECT_EQ(some.steps(0), 1);
  EXPECT_EQ(some.steps(1), 0);
  some.step_params({1});
  EXPECT_EQ(values(b), values(b2));
  EXPECT_EQ(some.steps(1), 1);
  const std::vector<double> a_now = values(a), b_now = values(b);
  GW_EXPECT_ERROR(some.step_params({2}), "AdamW::step_params", "parameter 2", "does not exist",
                  "2 parameters");
  GW_EXPECT_ERROR(some.step_params({1, 0, 1}), "AdamW::step_params", "parameter 1", "listed twice");
  EXPECT_EQ(values(a), a_now);
  EXPECT_EQ(values(b), b_now);
  EXPECT_EQ(some.steps(), 1);
}

// Note [Optimizer steps in the backward]: backward() with a StepInBackward leaves the parameters
// bitwise as backward() then opt.step() does, step after step, with SGD (momentum) and AdamW, and
// for any bucket size; a leaf the optimizer does not hold gets its gradient and keeps its value.
TEST(OptimCpu, StepsInTheBackwardGiveTheParametersOfAStepAfterIt) {
  const Tensor x = randn({16, 8}, 20, f64()), t = mul(randn({16, 4}, 21, f64()), 0.5);
  auto make = [] {
    return std::vector<Tensor>{param({12, 8}, 1), param({12}, 2), param({4, 12}, 3), param({4}, 4),
                               param({4}, 5)};
  };
  auto loss_of = [&](const std::vector<Tensor>& w) {
    const Tensor h = linear(x, w[0], w[1], Activation::kGelu);
    return mse_loss(add(linear(h, w[2], w[3]), w[4]), t);
  };
  for (int kind = 0; kind < 2; ++kind) {
    for (std::size_t bucket : {std::size_t{8}, std::size_t{1} << 20}) {
      SCOPED_TRACE((kind == 0 ? "SGD, bucket bytes " : "AdamW, bucket bytes ") +
                   std::to_string(bucket));
      const std::vector<Tensor> after = make(), in = make();
      // w[4] is not the optimizers': its gradient is made, its value kept.
      const std::vector<Tensor> held_after(after.begin(), after.begin() + 4),
          held_in(in.begin(), in.begin() + 4);
      std::unique_ptr<Optimizer> opt_after, opt_in;
      if (kind == 0) {
        opt_after = std::make_unique<Sgd>(held_after, SgdOptions{.lr = 0.05, .momentum = 0.9});
        opt_in = std::make_unique<Sgd>(held_in, SgdOptions{.lr = 0.05, .momentum = 0.9});
      } else {
        opt_after = std::make_unique<AdamW>(held_after, AdamWOptions{.lr = 0.01});
        opt_in = std::make_unique<AdamW>(held_in, AdamWOptions{.lr = 0.01});
      }
      StepInBackward in_backward(*opt_in, bucket);
      const std::vector<double> untouched = values(in[4]);
      for (int s = 0; s < 4; ++s) {
        backward(loss_of(after), {.grad_write = GradWrite::kOverwrite});
        opt_after->step();
        backward(loss_of(in),
                 {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &in_backward});
        for (std::size_t i = 0; i < 4; ++i) {
          EXPECT_EQ(values(in[i]), values(after[i])) << "step " << s << ", parameter " << i;
        }
        EXPECT_EQ(values(in[4].grad()), values(after[4].grad())) << "step " << s;
      }
      EXPECT_EQ(values(in[4]), untouched);
      EXPECT_EQ(opt_in->steps(), 4);
    }
  }
  GW_EXPECT_ERROR(StepInBackward(*std::make_unique<Sgd>(make(), SgdOptions{}), 0), "StepInBackward",
                  "bucket_bytes is 0");
}

// A two-layer MLP with a fused linear+GELU layer, trained on a fixed regression batch.
double train_mlp(Optimizer& opt, const std::vector<Tensor>& w, int steps, double* first) {
  const Tensor x = randn({16, 8}, 20, f64()), t = mul(randn({16, 4}, 21, f64()), 0.5);
  double last = 0;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Tensor h = linear(x, w[0], w[1], Activation::kGelu);
    const Tensor loss = mse_loss(linear(h, w[2], w[3]), t);
    backward(loss);
    opt.step();
    last = loss.item();
    if (s == 0) *first = last;
  }
  return last;
}

TEST(OptimCpu, AnMlpWithFusedGeluLayersTrainsWithSgdAndWithAdamW) {
  for (int which = 0; which < 2; ++which) {
    const std::vector<Tensor> w{mul(param({32, 8}, 30), 0.3).detach().set_requires_grad(true),
                                zeros({32}, f64()).set_requires_grad(true),
                                mul(param({4, 32}, 31), 0.2).detach().set_requires_grad(true),
                                zeros({4}, f64()).set_requires_grad(true)};
    std::unique_ptr<Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<Sgd>(w, SgdOptions{.lr = 0.1, .momentum = 0.9});
    } else {
      opt = std::make_unique<AdamW>(w, AdamWOptions{.lr = 0.01, .weight_decay = 0.0});
    }
    double first = 0;
    const double last = train_mlp(*opt, w, 200, &first);
    EXPECT_LT(last, 0.1 * first) << (which == 0 ? "Sgd" : "AdamW") << ": " << first << " -> "
                                 << last;
  }
}

// Note [Master weights]: a bfloat16 parameter is its float32 master rounded after every step,
// and the master moves exactly as a float32 parameter of the master's first values does under the
// same (bfloat16) gradients — SGD with momentum and AdamW with parameter groups alike; zero_grad
// and clip_grad_norm take the bfloat16 gradients.
template <class Opt, class Options>
void expect_master_is_a_float32_parameter(const Options& o, const char* what) {
  const Shape shapes[] = {{6, 9}, {9}};
  std::vector<Tensor> low, ref;
  for (std::size_t i = 0; i < 2; ++i) {
    const Tensor p = cast(randn(shapes[i], 60 + i), DType::kBFloat16);
    low.push_back(p.detach().set_requires_grad(true));
    ref.push_back(cast(p, DType::kFloat32).detach().set_requires_grad(true));
  }
  Opt a(decay_matrices_only(low), o), b(decay_matrices_only(ref), o);
  for (int s = 0; s < 6; ++s) {
    for (std::size_t i = 0; i < 2; ++i) {
      const Tensor g = cast(randn(shapes[i], 200 + 10 * s + i), DType::kBFloat16);
      low[i].grad() = g;
      ref[i].grad() = cast(g, DType::kFloat32);
    }
    a.step();
    b.step();
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const Tensor& master = a.master(i);
    EXPECT_EQ(master.dtype(), DType::kFloat32);
    EXPECT_EQ(master.to_vector<float>(), ref[i].to_vector<float>()) << what << " " << i;
    EXPECT_EQ(low[i].to_vector<bf16>(), cast(ref[i], DType::kBFloat16).to_vector<bf16>())
        << what << " " << i;
    EXPECT_NE(master.to_vector<float>(), cast(low[i], DType::kFloat32).to_vector<float>())
        << what << ": the master keeps what bfloat16 cannot";
  }
  EXPECT_EQ(a.steps(), 6);
  // clip_grad_norm on the bfloat16 gradients: their float32 norm, the gradients scaled.
  const Tensor norm = clip_grad_norm(low, 0.5);
  const Tensor ref_norm = clip_grad_norm(ref, 0.5);
  EXPECT_EQ(norm.dtype(), DType::kFloat32);
  EXPECT_NEAR(norm.item(), ref_norm.item(), 1e-6 * ref_norm.item());
  EXPECT_LT(testing::rel_error(cast(low[0].grad(), DType::kFloat32), ref[0].grad()), 1e-2);
  a.zero_grad();
  EXPECT_EQ(low[0].grad().to_vector<bf16>(), std::vector<bf16>(54, bf16::from_float(0.f)));
}

TEST(OptimCpu, Bf16ParametersAreTheirFloat32MastersRoundedAfterEveryStep) {
  expect_master_is_a_float32_parameter<Sgd>(
      SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}, "sgd");
  expect_master_is_a_float32_parameter<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1},
                                              "adamw");
  const Tensor f = randn({3}, 1).set_requires_grad(true);
  GW_EXPECT_ERROR(AdamW({cast(randn({3}, 2), DType::kBFloat16).set_requires_grad(true), f}),
                  "AdamW", "one device and one dtype");
}

}  // namespace
}  // namespace graphward
