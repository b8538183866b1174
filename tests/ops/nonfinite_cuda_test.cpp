// The CPU backend and CUDA agree on NaN and ±infinity, op by op, forward and backward: every op fed
// an input with NaN, +inf and −inf in some elements gives, on both devices, NaN in the same
// elements, the same infinities, and matching finite values elsewhere (the CPU is the suite's
// reference, so an op that drops a NaN on one backend makes every comparison through it wrong).
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "test_util.h"

namespace graphward {
namespace {
using testing::values;

constexpr Device kGpu = Device::cuda(0);
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Element by element: the same class (NaN, +inf, −inf, finite), and finite values close.
std::string disagreement(const std::vector<double>& cpu, const std::vector<double>& gpu,
                         double tol) {
  if (cpu.size() != gpu.size()) return "sizes differ";
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double a = cpu[i], b = gpu[i];
    const bool same = (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b) ||
                      (std::isfinite(a) && std::isfinite(b) &&
                       std::abs(a - b) <= tol * std::max(1.0, std::abs(a)));
    if (!same) {
      return "element " + std::to_string(i) + ": CPU " + std::to_string(a) + ", CUDA " +
             std::to_string(b);
    }
  }
  return "";
}

// x of `shape` with a NaN, a +inf and a −inf among ordinary values (at `at`, `at` + 1, `at` + 2).
Tensor with_nonfinite(const Shape& shape, std::uint64_t seed, std::int64_t at = 1) {
  std::vector<double> v = values(randn(shape, seed));
  const std::size_t n = v.size();
  v[static_cast<std::size_t>(at) % n] = kNaN;
  v[static_cast<std::size_t>(at + 1) % n] = kInf;
  v[static_cast<std::size_t>(at + 2) % n] = -kInf;
  std::vector<float> f(v.begin(), v.end());
  return from_vector(f, shape);
}

// `op` of the inputs on both devices; then the backward of sum(op(...)) to every input that
// requires grad, compared the same way.
void expect_agree(const std::string& what, const std::vector<Tensor>& cpu_inputs,
                  const std::function<Tensor(const std::vector<Tensor>&)>& op, double tol = 1e-4) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& t : cpu_inputs) {
    const bool grad = is_floating(t.dtype());
    cpu.push_back(t.detach());
    gpu.push_back(t.to(kGpu));
    if (grad) {
      cpu.back().set_requires_grad(true);
      gpu.back().set_requires_grad(true);
    }
  }
  const Tensor yc = op(cpu), yg = op(gpu);
  EXPECT_EQ(disagreement(values(yc), values(yg), tol), "") << what << " (forward)";
  backward(sum(yc));
  backward(sum(yg));
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].requires_grad()) continue;
    ASSERT_EQ(cpu[i].grad().defined(), gpu[i].grad().defined()) << what;
    if (!cpu[i].grad().defined()) continue;
    EXPECT_EQ(disagreement(values(cpu[i].grad()), values(gpu[i].grad()), tol), "")
        << what << " (gradient of input " << i << ")";
  }
}

class CudaNonFinite : public ::testing::Test {
 protected:
  void SetUp() override { GW_REQUIRE_GPU(); }
};

TEST_F(CudaNonFinite, ElementwiseOpsAndReductionsAgreeOnNaNAndInfinities) {
  const Tensor x = with_nonfinite({4, 9}, 1), y = randn({4, 9}, 2);
  using V = std::vector<Tensor>;
  expect_agree("relu", {x}, [](const V& a) { return relu(a[0]); });
  expect_agree("tanh", {x}, [](const V& a) { return tanh(a[0]); });
  expect_agree("sigmoid", {x}, [](const V& a) { return sigmoid(a[0]); });
  expect_agree("gelu", {x}, [](const V& a) { return gelu(a[0]); });
  expect_agree("add", {x, y}, [](const V& a) { return add(a[0], a[1]); });
  expect_agree("mul", {x, y}, [](const V& a) { return mul(a[0], a[1]); });
  expect_agree("sum", {x}, [](const V& a) { return sum(a[0]); });
  expect_agree("mean", {x}, [](const V& a) { return mean(a[0]); });
  expect_agree("mse_loss", {x, y}, [](const V& a) { return mse_loss(a[0], a[1].detach()); });
}

TEST_F(CudaNonFinite, SoftmaxCrossEntropyAndLayerNormAgreeOnNaNAndInfinities) {
  using V = std::vector<Tensor>;
  // Row 0: a NaN; row 1: +inf; row 2: −inf; row 3: finite (the non-finite values at 1, 10, 20).
  std::vector<float> v(4 * 9);
  const std::vector<double> r = values(randn({4, 9}, 3));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r[i]);
  v[1] = NAN;
  v[10] = INFINITY;
  v[20] = -INFINITY;
  const Tensor x = from_vector(v, {4, 9});
  const Tensor targets = from_vector(std::vector<std::int32_t>{0, 1, 2, 3}, {4});
  expect_agree("softmax", {x}, [](const V& a) { return softmax(a[0]); });
  expect_agree("log_softmax", {x}, [](const V& a) { return log_softmax(a[0]); });
  // As 4 queries over 9 keys: row 0's NaN is masked (a finite row), row 1's +inf and row 2's -inf
  // are kept.
  expect_agree("causal_softmax", {x}, [](const V& a) { return causal_softmax(a[0]); });
  expect_agree("cross_entropy", {x, targets}, [](const V& a) { return cross_entropy(a[0], a[1]); });
  expect_agree("layer_norm", {x, randn({9}, 4), randn({9}, 5)},
               [](const V& a) { return layer_norm(a[0], a[1], a[2]); });
}

TEST_F(CudaNonFinite, LinearLayersAndTheirFusedActivationsAgreeOnNaNAndInfinities) {
  using V = std::vector<Tensor>;
  const Tensor x = with_nonfinite({5, 8}, 6), w = randn({3, 8}, 7), b = randn({3}, 8);
  expect_agree("linear", {x, w, b}, [](const V& a) { return linear(a[0], a[1], a[2]); });
  expect_agree("linear + relu", {x, w, b},
               [](const V& a) { return linear(a[0], a[1], a[2], Activation::kRelu); });
  expect_agree("linear + gelu", {x, w, b},
               [](const V& a) { return linear(a[0], a[1], a[2], Activation::kGelu); });
  expect_agree("matmul", {x, transpose(w, 0, 1)}, [](const V& a) { return matmul(a[0], a[1]); });
}

// max_pool2d: a window holding a NaN pools to NaN on both (the CPU dropped it: [NaN, 1, 2, 3]
// pooled to 3), a window of NaNs to NaN (the CPU gave −inf), and the gradient goes where CUDA
// sends it; avg_pool2d likewise. Not convolutions: cuDNN's transform algorithms (FFT, Winograd)
// spread a non-finite input over outputs whose windows do not hold it (seen on the H200: −FLT_MAX
// in a finite output's place), as in PyTorch on the GPU; where they go is cuDNN's, not promised.
TEST_F(CudaNonFinite, PoolingAndConvolutionAgreeOnNaNAndInfinities) {
  using V = std::vector<Tensor>;
  std::vector<float> v = {NAN, 1, 2, 3, 5, 6, 7, 8, NAN, NAN, NAN, NAN, 1, INFINITY, -INFINITY, 0};
  // Windows 2×2 of a 4×4 image: [NaN 1 5 6], [2 3 7 8], [NaN NaN 1 inf], [NaN NaN -inf 0].
  const Tensor x = from_vector(v, {1, 1, 4, 4});
  const Tensor pooled = max_pool2d(x, {.kernel = 2, .stride = 2});
  const std::vector<double> p = values(pooled);
  EXPECT_TRUE(std::isnan(p[0]) && p[1] == 8 && std::isnan(p[2]) && std::isnan(p[3]))
      << "CPU max_pool2d: " << p[0] << " " << p[1] << " " << p[2] << " " << p[3];
  expect_agree("max_pool2d", {x},
               [](const V& a) { return max_pool2d(a[0], {.kernel = 2, .stride = 2}); });
  expect_agree("avg_pool2d", {x},
               [](const V& a) { return avg_pool2d(a[0], {.kernel = 2, .stride = 2}); });
  // Channels last (one channel: the same memory), where 2x2 windows tiling the image are ours.
  const Tensor xl = from_vector(v, {1, 4, 4, 1});
  const Pool2dOptions last{.kernel = 2, .stride = 2, .channels_last = true};
  expect_agree("max_pool2d, channels last", {xl},
               [&](const V& a) { return max_pool2d(a[0], last); });
  expect_agree("avg_pool2d, channels last", {xl},
               [&](const V& a) { return avg_pool2d(a[0], last); });
  // conv2d's own ReLU (after cuDNN's convolution) keeps a NaN as relu does: a NaN bias gives
  // NaN outputs, a finite image finite ones.
  const Tensor img = randn({2, 3, 6, 6}, 9), w = randn({4, 3, 3, 3}, 10);
  const Tensor b = from_vector(std::vector<float>{NAN, 0.5f, -INFINITY, 1.f}, {4});
  expect_agree("conv2d + relu, a NaN bias", {img, w, b}, [](const V& a) {
    return conv2d(a[0], a[1], a[2],
                  {.padding = 1, .deterministic = true, .activation = Activation::kRelu});
  });
}

}  // namespace
}  // namespace graphward
