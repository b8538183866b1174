// conv2d, max_pool2d and avg_pool2d on the CPU backend: values against hand-computed results,
// gradients against finite differences, and the errors.
#include "engine/autograd.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::gradcheck_error;
using testing::Inputs;
using testing::values;

TEST(ConvCpu, Conv2dMatchesAHandComputedCorrelationWithPaddingStrideAndBias) {
  // x: one 3x3 image 1..9; w: one 2x2 filter [[1, 0], [0, -1]]; bias 0.5.
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Tensor w = from_vector(std::vector<double>{1, 0, 0, -1}, {1, 1, 2, 2});
  const Tensor b = from_vector(std::vector<double>{0.5}, {1});
  // No padding: y[i][j] = x[i][j] - x[i+1][j+1] = -4 everywhere.
  EXPECT_EQ(values(conv2d(x, w, b)), (std::vector<double>{-3.5, -3.5, -3.5, -3.5}));
  // Padding 1, stride 2: outputs at (-1,-1), (-1,1), (1,-1), (1,1) of the padded grid.
  EXPECT_EQ(values(conv2d(x, w, Tensor(), {.stride = 2, .padding = 1})),
            (std::vector<double>{-1, -3, -7, 5 - 9}));
  EXPECT_EQ(conv2d(randn({2, 3, 8, 6}, 1, f64()), randn({4, 3, 3, 3}, 2, f64()), Tensor(),
                   {.stride = 2, .padding = 1})
                .shape(),
            Shape({2, 4, 4, 3}));
}

TEST(ConvCpu, PoolingTakesEachWindowsMaximumOrMean) {
  const Tensor x = from_vector(std::vector<double>{1, 5, 2, 0, 3, 4, 8, 1, 0, 2, 6, 7, 9, 1, 3, 4},
                               {1, 1, 4, 4});
  EXPECT_EQ(values(max_pool2d(x)), (std::vector<double>{5, 8, 9, 7}));
  EXPECT_EQ(values(avg_pool2d(x)), (std::vector<double>{13.0 / 4, 11.0 / 4, 12.0 / 4, 20.0 / 4}));
  // Padding counts as zeros in the mean and never wins the maximum.
  const Tensor neg = mul(x, -1.0);
  EXPECT_EQ(values(max_pool2d(neg, {.kernel = 2, .stride = 2, .padding = 1}))[0], -1.0);
  EXPECT_EQ(values(avg_pool2d(x, {.kernel = 2, .stride = 2, .padding = 1}))[0], 0.25);
  EXPECT_EQ(max_pool2d(randn({2, 3, 7, 5}, 3, f64()), {.kernel = 3, .stride = 2}).shape(),
            Shape({2, 3, 3, 2}));
}

TEST(ConvGradcheckCpu, Conv2dForEveryInputWithPaddingAndStride) {
  for (auto [stride, padding] : {std::pair{1, 0}, {1, 1}, {2, 1}}) {
    const Conv2dOptions o{.stride = stride, .padding = padding};
    const double err = gradcheck_error(
        [o](const Inputs& in) { return conv2d(in[0], in[1], in[2], o); },
        [o](const Tensor& g, const Inputs& in) {
          Tensor gx, gw, gb;
          conv2d_backward(g, in[0], in[1], o, {&gx}, {&gw}, {&gb});
          return Inputs{gx, gw, gb};
        },
        {randn({2, 3, 5, 4}, 4, f64()), randn({2, 3, 3, 2}, 5, f64()), randn({2}, 6, f64())});
    EXPECT_LT(err, 1e-7) << "stride " << stride << " padding " << padding;
  }
}

TEST(ConvGradcheckCpu, MaxAndAveragePooling) {
  for (auto [kernel, stride, padding] : {std::tuple{2, 0, 0}, {3, 2, 1}, {2, 1, 1}}) {
    const Pool2dOptions o{.kernel = kernel, .stride = stride, .padding = padding};
    const double max_err = gradcheck_error(
        [o](const Inputs& in) { return max_pool2d(in[0], o); },
        [o](const Tensor& g, const Inputs& in) {
          Tensor gx;
          max_pool2d_backward(g, in[0], max_pool2d(in[0], o), o, {&gx});
          return Inputs{gx};
        },
        {randn({2, 2, 5, 6}, 7, f64())});  // random values: no ties
    EXPECT_LT(max_err, 1e-7) << "max, kernel " << kernel;
    const double avg_err = gradcheck_error(
        [o](const Inputs& in) { return avg_pool2d(in[0], o); },
        [o](const Tensor& g, const Inputs& in) {
          Tensor gx;
          avg_pool2d_backward(g, in[0].shape(), o, {&gx});
          return Inputs{gx};
        },
        {randn({2, 2, 5, 6}, 8, f64())});
    EXPECT_LT(avg_err, 1e-7) << "avg, kernel " << kernel;
  }
}

TEST(ConvCpu, ASmallConvnetTrainsThroughTheTape) {
  const Tensor x = randn({4, 2, 6, 6}, 9, f64());
  const Tensor w = mul(randn({3, 2, 3, 3}, 10, f64()), 0.3).set_requires_grad(true);
  const Tensor b = zeros({3}, f64()).set_requires_grad(true);
  const Tensor y = avg_pool2d(max_pool2d(relu(conv2d(x, w, b, {.padding = 1}))));
  backward(sum(y));
  EXPECT_EQ(w.grad().shape(), w.shape());
  EXPECT_EQ(b.grad().shape(), b.shape());
  double norm = 0;
  for (double v : values(w.grad())) norm += v * v;
  EXPECT_GT(norm, 0.0);
}

TEST(ConvCpu, BadShapesAndOptionsAreRefusedByName) {
  const Tensor x = randn({1, 3, 5, 5}, 11, f64());
  GW_EXPECT_ERROR(conv2d(x, randn({2, 4, 3, 3}, 12, f64())), "conv2d", "3 channels",
                  "C == x.shape[1]");
  GW_EXPECT_ERROR(conv2d(x, randn({2, 3, 7, 7}, 12, f64())), "conv2d", "7x7",
                  "does not fit the padded 5x5");
  GW_EXPECT_ERROR(conv2d(x, randn({2, 3, 3, 3}, 12, f64()), randn({3}, 13, f64())), "conv2d",
                  "bias", "[2]");
  GW_EXPECT_ERROR(conv2d(x, randn({2, 3, 3, 3}, 12, f64()), Tensor(), {.stride = 0}), "conv2d",
                  "stride >= 1");
  GW_EXPECT_ERROR(conv2d(randn({3, 5, 5}, 14, f64()), randn({2, 3, 3, 3}, 12, f64())), "conv2d",
                  "4-d");
  GW_EXPECT_ERROR(max_pool2d(x, {.kernel = 2, .stride = 2, .padding = 2}), "max_pool2d",
                  "padding <= kernel / 2");
  GW_EXPECT_ERROR(avg_pool2d(x, {.kernel = 7}), "avg_pool2d", "7x7", "does not fit");
  GW_EXPECT_ERROR(avg_pool2d(randn({5, 5}, 15, f64())), "avg_pool2d", "4-d");
}

}  // namespace
}  // namespace graphward
