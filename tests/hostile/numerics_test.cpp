// Hostile numerics, by class: every op whose math depends on the magnitude of its input, against
// the float64 program of the same float32 inputs, at magnitudes from 1 to 1e8; NaN in the ops
// that take a maximum; optimizer hyperparameters that vanish as float32; step counts past 2^24.
#include <cfloat>
#include <cmath>
#include <limits>

#include "test_util.h"

namespace graphward {
namespace {
using testing::values;

const double kOffsets[] = {0.0, 1.0, 1e2, 1e4, 1e6, 1e7, 3e7, 1e8, -1e7};

// Rows offset + [0, 1, 2, 3] (and a spread row), as float32; the float64 softmax of exactly those
// float32 values.
struct Rows {
  Tensor x;                  // float32 [2, 4]
  std::vector<double> x64;   // its values
  std::vector<double> soft;  // softmax in float64
  std::vector<double> lse;   // each row's log Σ exp in float64
};
Rows rows_at(double offset) {
  Rows r;
  std::vector<float> f;
  for (double d : {0.0, 1.0, 2.0, 3.0, -3.0, 0.5, 2.5, 1.0})
    f.push_back(static_cast<float>(offset + d));
  r.x = from_vector(f, {2, 4});
  r.x64.assign(f.begin(), f.end());
  for (int i = 0; i < 2; ++i) {
    double m = r.x64[4 * i];
    for (int j = 1; j < 4; ++j) m = std::max(m, r.x64[4 * i + j]);
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(r.x64[4 * i + j] - m);
    r.lse.push_back(m + std::log(s));
    for (int j = 0; j < 4; ++j) r.soft.push_back(std::exp(r.x64[4 * i + j] - m) / s);
  }
  return r;
}

// log_softmax and cross_entropy form (x − max) − log Σ exp(x − max), softmax (and the causal
// softmax, over each row's kept keys) exp(x − max) / Σ exp(x − max): within float32
// rounding of the float64 program at every magnitude (they subtracted the rounded log-sum-exp:
// at 1e7 a softmax summed to 1.553 and a cross-entropy was 3.000 for 3.440).
TEST(Magnitudes, SoftmaxLogSoftmaxCausalSoftmaxAndCrossEntropyHoldAtEveryMagnitude) {
  for (double offset : kOffsets) {
    const Rows r = rows_at(offset);
    const std::vector<double> soft = values(softmax(r.x));
    const std::vector<double> logsoft = values(log_softmax(r.x));
    for (std::size_t k = 0; k < soft.size(); ++k) {
      EXPECT_NEAR(soft[k], r.soft[k], 1e-6) << "softmax at " << offset;
      EXPECT_NEAR(logsoft[k], r.x64[k] - r.lse[k / 4], 1e-5) << "log_softmax at " << offset;
    }
    // The causal softmax of the rows as 2 queries over 4 keys: row 0 keeps its first key (weight
    // 1), row 1 its first two, in the same two-part form.
    const std::vector<double> causal = values(causal_softmax(r.x));
    const double m1 = std::max(r.x64[4], r.x64[5]);
    const double s1 = std::exp(r.x64[4] - m1) + std::exp(r.x64[5] - m1);
    const double want[8] = {1, 0, 0, 0, std::exp(r.x64[4] - m1) / s1, std::exp(r.x64[5] - m1) / s1,
                            0, 0};
    for (int k = 0; k < 8; ++k) {
      EXPECT_NEAR(causal[k], want[k], 1e-6) << "causal_softmax at " << offset << ", element " << k;
    }
    const Tensor targets = from_vector(std::vector<std::int32_t>{0, 2}, {2});
    const Tensor x = r.x.detach().set_requires_grad(true);
    const Tensor loss = cross_entropy(x, targets);
    const double expect = ((r.lse[0] - r.x64[0]) + (r.lse[1] - r.x64[6])) / 2;
    EXPECT_NEAR(loss.item(), expect, 1e-5 * std::max(1.0, expect)) << "cross_entropy at " << offset;
    backward(loss);
    const std::vector<double> g = values(x.grad());
    for (int i = 0; i < 2; ++i) {
      double row = 0;
      for (int j = 0; j < 4; ++j) {
        row += g[4 * i + j];
        const double want = (r.soft[4 * i + j] - (j == (i ? 2 : 0) ? 1.0 : 0.0)) / 2;
        EXPECT_NEAR(g[4 * i + j], want, 1e-6) << "cross_entropy's gradient at " << offset;
      }
      EXPECT_NEAR(row, 0.0, 1e-6) << "a gradient row of cross_entropy at " << offset;
    }
  }
}

// layer_norm's CPU backward computes x̂ as its forward did (from the float64 mean), so its dx
// matches the float64 program at any offset (from the rounded mean: 1.5% off at 1000 ± 0.01).
TEST(Magnitudes, LayerNormsBackwardOnTheCpuMatchesTheFloat64ProgramAtEveryOffset) {
  for (double offset : {0.0, 1e3, 1e4, -1e4}) {
    std::vector<float> f;
    const std::vector<double> noise = values(randn({3, 16}, 7));
    for (double n : noise) f.push_back(static_cast<float>(offset + 0.01 * n));
    const Tensor x32 = from_vector(f, {3, 16}).set_requires_grad(true);
    const Tensor x64 =
        from_vector(std::vector<double>(f.begin(), f.end()), {3, 16}).set_requires_grad(true);
    const Tensor w32 = randn({16}, 8), w64 = from_vector(values(w32), {16});
    const Tensor dy = randn({3, 16}, 9);
    backward({layer_norm(x32, w32, Tensor())}, {dy});
    backward({layer_norm(x64, w64, Tensor())}, {from_vector(values(dy), {3, 16})});
    EXPECT_LT(testing::rel_error(values(x32.grad()), values(x64.grad())), 1e-4)
        << "layer_norm dx at offset " << offset;
  }
}

// max_pool2d on the CPU: a window holding a NaN pools to NaN (std::max dropped it: [NaN, 1, 2, 3]
// pooled to 3), a window of NaNs to NaN (it gave −inf); the gradient goes to the window's first
// NaN, as the forward chose it.
TEST(NonFinite, MaxPoolingOnTheCpuPropagatesNaNAndRoutesItsGradientThere) {
  const float nan = NAN;
  const Tensor x = from_vector(
      std::vector<float>{nan, 1, 5, 6, 2, 3, 7, 8, nan, nan, 1, INFINITY, nan, nan, -INFINITY, 0},
      {1, 1, 4, 4});
  // Windows 2×2: [NaN 1 | 2 3], [5 6 | 7 8], [NaN NaN | NaN NaN], [1 inf | -inf 0].
  const Tensor xr = x.detach().set_requires_grad(true);
  const Tensor y = max_pool2d(xr, {.kernel = 2, .stride = 2});
  const std::vector<double> p = values(y);
  EXPECT_TRUE(std::isnan(p[0])) << p[0];
  EXPECT_EQ(p[1], 8);
  EXPECT_TRUE(std::isnan(p[2])) << p[2];
  EXPECT_EQ(p[3], INFINITY);
  backward({y}, {ones({1, 1, 2, 2})});
  const std::vector<double> g = values(xr.grad());
  EXPECT_EQ(g, (std::vector<double>{1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0}));
}

// A hyperparameter that must be positive and is 0 once the kernels read it as float32 is
// refused by name (AdamW's eps = 1e-50 turned every parameter into NaN), for every one of them.
TEST(VanishingHyperparameters, EveryPositiveHyperparameterThatIsZeroAsFloat32IsRefused) {
  const Tensor p = ones({4}).set_requires_grad(true);
  p.grad() = ones({4});
  GW_EXPECT_ERROR(AdamW({p}, {.eps = 1e-50}), "AdamW", "eps", "0 as float32");
  GW_EXPECT_ERROR(AdamW({p}, {.eps = 1e-46}), "AdamW", "eps", "0 as float32");
  GW_EXPECT_ERROR(clip_grad_norm({p}, 1e-50), "clip_grad_norm", "max_norm", "0 as float32");
  AdamW ok({p}, {.eps = 1e-30});  // small but a float32
  ok.step();
  for (double v : values(p)) EXPECT_TRUE(std::isfinite(v));
  // float64 parameters take what a double holds.
  const Tensor q = ones({4}, {DType::kFloat64}).set_requires_grad(true);
  q.grad() = ones({4}, {DType::kFloat64});
  AdamW fine({q}, {.eps = 1e-50});
  fine.step();
  for (double v : values(q)) EXPECT_TRUE(std::isfinite(v));
}

// Step counts are exact past 2^24 (they lived in a float32 tensor: a replayed step that ran 2^24
// times stopped counting), and resuming sets them.
TEST(Counters, OptimizerStepCountsPassTwoToTheTwentyFour) {
  const Tensor p = ones({4}).set_requires_grad(true);
  p.grad() = ones({4});
  AdamW adamw({p});
  Sgd sgd({p}, {.momentum = 0.9});
  const std::int64_t start = std::int64_t{1} << 24;
  adamw.set_steps(0, start);
  sgd.set_steps(0, start);
  for (int i = 0; i < 3; ++i) {
    adamw.step();
    sgd.step();
  }
  EXPECT_EQ(adamw.steps(0), start + 3);
  EXPECT_EQ(sgd.steps(), start + 3);
  adamw.set_steps(0, (std::int64_t{1} << 40) + 1);
  adamw.step();
  EXPECT_EQ(adamw.steps(0), (std::int64_t{1} << 40) + 2);
  GW_EXPECT_ERROR(adamw.set_steps(0, -1), "set_steps", "-1");
  GW_EXPECT_ERROR(adamw.set_steps(1, 5), "set_steps", "parameter 1");
  GW_EXPECT_ERROR(adamw.set_steps(0, (std::int64_t{1} << 53) + 1), "set_steps", "2^53");
}

}  // namespace
}  // namespace graphward
