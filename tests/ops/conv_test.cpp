// conv2d, max_pool2d and avg_pool2d on the CPU backend: values against hand-computed results,
// gradients against finite differences, and the errors.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "graphward/engine/backward/backward.h"
#include "graphward/engine/tape/autograd.h"
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
    const double max_err =
        gradcheck_error([o](const Inputs& in) { return max_pool2d(in[0], o); },
                        [o](const Tensor& g, const Inputs& in) {
                          Tensor gx;
                          max_pool2d_backward(g, in[0], max_pool2d(in[0], o), o, {&gx});
                          return Inputs{gx};
                        },
                        {randn({2, 2, 5, 6}, 7, f64())});  // random values: no ties
    EXPECT_LT(max_err, 1e-7) << "max, kernel " << kernel;
    const double avg_err = gradcheck_error([o](const Inputs& in) { return avg_pool2d(in[0], o); },
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

// Conv2dOptions::activation: a convolution with its ReLU is relu(conv2d(...)) — the output, and
// every gradient through the tape, bitwise — with and without a bias, at two strides, in float
// and double; one node ("conv2d_relu") instead of two.
TEST(ConvCpu, AConvolutionWithItsReluIsReluOfTheConvolutionBitwise) {
  for (DType dt : {DType::kFloat64, DType::kFloat32}) {
    const TensorOptions opt{dt, Device::cpu()};
    for (bool with_bias : {true, false}) {
      for (auto [stride, padding] : {std::pair{1, 1}, {2, 0}}) {
        auto leaf = [&](const Shape& shape, std::uint64_t seed) {
          return randn(shape, seed, opt).set_requires_grad(true);
        };
        const Tensor x1 = leaf({2, 3, 7, 6}, 21), w1 = leaf({4, 3, 3, 3}, 22),
                     b1 = with_bias ? leaf({4}, 23) : Tensor();
        const Tensor x2 = leaf({2, 3, 7, 6}, 21), w2 = leaf({4, 3, 3, 3}, 22),
                     b2 = with_bias ? leaf({4}, 23) : Tensor();
        const Conv2dOptions plain{.stride = stride, .padding = padding};
        Conv2dOptions fused = plain;
        fused.activation = Activation::kRelu;
        const Tensor y1 = conv2d(x1, w1, b1, fused), y2 = relu(conv2d(x2, w2, b2, plain));
        const std::string what = std::string(dtype_name(dt)) + (with_bias ? " bias" : "") +
                                 " stride " + std::to_string(stride);
        EXPECT_EQ(values(y1), values(y2)) << what;
        EXPECT_EQ(y1.grad_fn()->name(), std::string("conv2d_relu")) << what;
        // Some outputs are negative before the ReLU: its backward matters.
        const std::vector<double> out = values(y1);
        EXPECT_GT(std::count(out.begin(), out.end(), 0.0), 0) << what;
        const Tensor r = randn(y1.shape(), 24, opt);
        backward(sum(mul(y1, r)));
        backward(sum(mul(y2, r)));
        EXPECT_EQ(values(x1.grad()), values(x2.grad())) << what;
        EXPECT_EQ(values(w1.grad()), values(w2.grad())) << what;
        if (with_bias) {
          EXPECT_EQ(values(b1.grad()), values(b2.grad())) << what;
        }
      }
    }
  }
}

// Note [Backward epilogue fusion] (engine/ops/ops.h): a conv2d_relu whose output feeds one pooling
// alone leaves its ReLU's backward to the pooling's. The plan fuses exactly that step, and the
// gradients are bitwise the unfused plan's — max and average pooling, float and double,
// non-overlapping and overlapping padded windows, both write modes; some windows are all zero
// (the ReLU's mask decides there), and a ReLU output read twice is not fused.
TEST(ConvCpu, APoolingTakesTheReluOfTheConvolutionBeforeItBitwise) {
  for (DType dt : {DType::kFloat64, DType::kFloat32}) {
    const TensorOptions opt{dt, Device::cpu()};
    auto leaf = [&](const Shape& shape, std::uint64_t seed) {
      return randn(shape, seed, opt).set_requires_grad(true);
    };
    const Tensor x = leaf({2, 3, 8, 7}, 41), w = leaf({4, 3, 3, 3}, 42), b = leaf({4}, 43);
    const Conv2dOptions conv_relu{.padding = 1, .activation = Activation::kRelu};
    for (const bool max : {true, false}) {
      for (const Pool2dOptions pool : {Pool2dOptions{2, 2, 0}, Pool2dOptions{3, 1, 1}}) {
        const std::string what = std::string(dtype_name(dt)) + (max ? " max" : " average") +
                                 " pool " + std::to_string(pool.kernel);
        auto pool_of = [&](const Tensor& h) {
          return max ? max_pool2d(h, pool) : avg_pool2d(h, pool);
        };
        const Tensor y = pool_of(conv2d(x, w, b, conv_relu));
        const std::vector<double> out = values(y);
        if (max) {
          EXPECT_GT(std::count(out.begin(), out.end(), 0.0), 0) << what << ": no zero window";
        }
        const Tensor r = randn(y.shape(), 44, opt);
        auto loss = [&] { return sum(mul(pool_of(conv2d(x, w, b, conv_relu)), r)); };
        const Tensor planned = sum(mul(y, r));
        const BackwardPlan plan = plan_for({planned});
        int fusing = 0;
        for (const auto& st : plan.steps) fusing += st.fuses_activation_of >= 0;
        EXPECT_EQ(fusing, 1) << what << "\n" << plan.dump();
        const Tensor h = conv2d(x, w, b, conv_relu);
        int twice = 0;
        for (const auto& st : plan_for({add(sum(mul(pool_of(h), r)), sum(h))}).steps) {
          twice += st.fuses_activation_of >= 0;
        }
        EXPECT_EQ(twice, 0) << what << ": the ReLU's output is read twice";
        for (const GradWrite mode : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
          std::vector<std::vector<double>> expected;
          for (const Tensor* t : {&x, &w, &b}) t->grad() = Tensor();
          for (int i = 0; i < 2; ++i) {
            backward(loss(), {.grad_write = mode, .fuse_activation_epilogues = false});
          }
          for (const Tensor* t : {&x, &w, &b}) {
            expected.push_back(values(t->grad()));
            t->grad() = Tensor();
          }
          for (int i = 0; i < 2; ++i) backward(loss(), {.grad_write = mode});
          int i = 0;
          for (const Tensor* t : {&x, &w, &b}) {
            EXPECT_EQ(values(t->grad()), expected[i]) << what << " parameter " << i;
            ++i;
          }
        }
      }
    }
  }
}

// Channels last (Conv2dOptions/Pool2dOptions::channels_last): a convolution (with and without
// its ReLU, two strides) and the pooling after it (max and average) are the NCHW ops on the same
// tensors permuted to NHWC — the outputs and the input and weight gradients bitwise (each element
// sums the same terms in the same order), the bias gradient within double rounding (its sum runs
// over the elements in memory order).
TEST(ConvCpu, ChannelsLastIsTheNchwConvolutionAndPoolingOnPermutedTensors) {
  auto to_nhwc = [](const Tensor& t) { return transpose(transpose(t, 1, 2), 2, 3); };
  auto to_nchw = [](const Tensor& t) { return transpose(transpose(t, 2, 3), 1, 2); };
  for (auto [stride, padding] : {std::pair{1, 1}, {2, 0}}) {
    for (const bool relu : {true, false}) {
      for (const bool max : {true, false}) {
        const std::string what = "stride " + std::to_string(stride) + (relu ? " relu" : "") +
                                 (max ? " max" : " average");
        auto leaf = [](const Tensor& t) { return t.detach().set_requires_grad(true); };
        const Tensor x = randn({2, 3, 7, 6}, 71, f64()), w = randn({4, 3, 3, 3}, 72, f64()),
                     b = randn({4}, 73, f64());
        const Tensor xn = leaf(x), wn = leaf(w), bn = leaf(b);
        const Tensor xc = leaf(to_nhwc(x)), wc = leaf(to_nhwc(w)), bc = leaf(b);
        Conv2dOptions o{.stride = stride,
                        .padding = padding,
                        .activation = relu ? Activation::kRelu : Activation::kNone};
        Pool2dOptions p{.kernel = 2};
        auto net = [&](const Tensor& x_, const Tensor& w_, const Tensor& b_) {
          const Tensor h = conv2d(x_, w_, b_, o);
          return max ? max_pool2d(h, p) : avg_pool2d(h, p);
        };
        const Tensor yn = net(xn, wn, bn);
        o.channels_last = p.channels_last = true;
        const Tensor yc = net(xc, wc, bc);
        EXPECT_EQ(yc.shape(), to_nhwc(yn).shape()) << what;
        EXPECT_EQ(values(to_nchw(yc)), values(yn)) << what;
        const Tensor r = randn(yn.shape(), 74, f64());
        backward(sum(mul(yn, r)));
        backward(sum(mul(yc, to_nhwc(r))));
        EXPECT_EQ(values(to_nchw(xc.grad())), values(xn.grad())) << what;
        EXPECT_EQ(values(to_nchw(wc.grad())), values(wn.grad())) << what;
        const std::vector<double> gb = values(bc.grad()), want = values(bn.grad());
        for (std::size_t i = 0; i < want.size(); ++i) {
          EXPECT_NEAR(gb[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << what;
        }
      }
    }
  }
}

// A pooling's backward with an epilogue it cannot apply — not a plain ReLU, not of its input,
// accumulating — is refused by name, and nothing is written.
TEST(ConvCpu, APoolingBackwardRefusesAnEpilogueNotOfItsInput) {
  const Tensor x = relu(randn({1, 2, 4, 4}, 51, f64()));
  const Pool2dOptions o{.kernel = 2};
  const Tensor y = max_pool2d(x, o), dy = randn(y.shape(), 52, f64());
  const Tensor other = relu(randn({1, 2, 4, 4}, 53, f64()));
  for (const bool max : {true, false}) {
    const char* op = max ? "max_pool2d_backward" : "avg_pool2d_backward";
    auto expect_refused = [&](Activation act, const Tensor& act_input, bool accumulate,
                              const char* what) {
      GradEpilogue ep;
      ep.act = act;
      ep.act_input = act_input;
      Tensor gx = accumulate ? randn(x.shape(), 54, f64()) : Tensor();
      const std::vector<double> before = accumulate ? values(gx) : std::vector<double>{};
      GradSlot slot{&gx, accumulate};
      slot.epilogue = &ep;
      if (max) {
        GW_EXPECT_ERROR(max_pool2d_backward(dy, x, y, o, slot), op, what);
      } else {
        GW_EXPECT_ERROR(avg_pool2d_backward(dy, x.shape(), o, slot), op, what);
      }
      if (accumulate) {
        EXPECT_EQ(values(gx), before) << op;
      } else {
        EXPECT_FALSE(gx.defined()) << op;
      }
    };
    expect_refused(Activation::kGelu, x, false, "not a plain ReLU");
    expect_refused(Activation::kNone, x, false, "not a plain ReLU");
    expect_refused(Activation::kRelu, Tensor(), false, "an undefined tensor");
    expect_refused(Activation::kRelu, x.view({1, 2, 16}), false, "the pooling's input");
    expect_refused(Activation::kRelu, relu(randn({1, 2, 4, 4}, 55)), false,
                   "the pooling's input");  // float32, not float64
    expect_refused(Activation::kRelu, x, true, "accumulates");
    if (max) {  // average pooling saves no x: any tensor of its shape stands for it
      expect_refused(Activation::kRelu, other, false, "the pooling's input");
    }
  }
}

TEST(ConvCpu, BadShapesAndOptionsAreRefusedByName) {
  const Tensor x = randn({1, 3, 5, 5}, 11, f64());
  GW_EXPECT_ERROR(conv2d(x, randn({2, 4, 3, 3}, 12, f64())), "conv2d", "3 channels",
                  "C == x.shape[1]");
  // Channels last: x [N, H, W, C] (here 5 channels), weight [K, R, S, C].
  GW_EXPECT_ERROR(conv2d(x, randn({2, 3, 3, 3}, 12, f64()), Tensor(), {.channels_last = true}),
                  "conv2d", "5 channels", "[K, R, S, C]", "C == x.shape[3]");
  GW_EXPECT_ERROR(max_pool2d(randn({3, 5, 5}, 14, f64()), {.channels_last = true}), "max_pool2d",
                  "[N, H, W, C] (channels last)");
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
  // An activation a convolution does not apply; the convolution's own backward with one set.
  const Tensor w = randn({2, 3, 3, 3}, 12, f64());
  GW_EXPECT_ERROR(conv2d(x, w, Tensor(), {.activation = Activation::kGelu}), "conv2d", "kGelu",
                  "Activation::kRelu");
  Tensor gx;
  GW_EXPECT_ERROR(conv2d_backward(conv2d(x, w), x, w, {.activation = Activation::kRelu}, {&gx}, {}),
                  "conv2d_backward", "Activation::kNone");
  EXPECT_FALSE(gx.defined());
}

}  // namespace
}  // namespace graphward
