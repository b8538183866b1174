// Ops on the CPU backend: forward against hand-computed values, backward against finite
// differences (float64), and the write/accumulate contract of gradient slots.
#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::gradcheck_error;
using testing::Inputs;
using testing::values;

std::vector<double> vals(const Tensor& t) {
  return values(t);
}

TEST(OpsForwardCpu, MatmulMatchesHandComputedProduct) {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector(std::vector<float>{7, 8, 9, 10, 11, 12}, {3, 2});
  const Tensor c = matmul(a, b);
  EXPECT_EQ(c.shape(), Shape({2, 2}));
  EXPECT_EQ(vals(c), (std::vector<double>{58, 64, 139, 154}));
}

TEST(OpsForwardCpu, LinearIsInputTimesWeightTransposedPlusBias) {
  const Tensor x = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Tensor w = from_vector(std::vector<float>{1, 0, 1, 1, 0, 2}, {3, 2});  // [out=3, in=2]
  const Tensor b = from_vector(std::vector<float>{10, 20, 30}, {3});
  EXPECT_EQ(vals(linear(x, w, b)), (std::vector<double>{11, 23, 34, 13, 27, 38}));
  EXPECT_EQ(vals(linear(x, w)), (std::vector<double>{1, 3, 4, 3, 7, 8}));
}

TEST(OpsForwardCpu, AddSubMulSameShapeRowBroadcastAndScalar) {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector(std::vector<float>{6, 5, 4, 3, 2, 1}, {2, 3});
  const Tensor row = from_vector(std::vector<float>{10, 20, 30}, {3});
  const Tensor row2 = from_vector(std::vector<float>{10, 20, 30}, {1, 3});
  EXPECT_EQ(vals(add(a, b)), (std::vector<double>{7, 7, 7, 7, 7, 7}));
  EXPECT_EQ(vals(sub(a, b)), (std::vector<double>{-5, -3, -1, 1, 3, 5}));
  EXPECT_EQ(vals(mul(a, b)), (std::vector<double>{6, 10, 12, 12, 10, 6}));
  EXPECT_EQ(vals(add(a, row)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(vals(add(row2, a)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(vals(sub(row, a)), (std::vector<double>{9, 18, 27, 6, 15, 24}));
  EXPECT_EQ(vals(mul(a, row2)), (std::vector<double>{10, 40, 90, 40, 100, 180}));
  EXPECT_EQ(add(row, a).shape(), Shape({2, 3}));
  EXPECT_EQ(vals(add(a, 0.5)), (std::vector<double>{1.5, 2.5, 3.5, 4.5, 5.5, 6.5}));
  EXPECT_EQ(vals(sub(a, 1.0)), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(vals(mul(a, -2.0)), (std::vector<double>{-2, -4, -6, -8, -10, -12}));
}

TEST(OpsForwardCpu, ActivationsMatchTheirDefinitions) {
  const Tensor x = from_vector(std::vector<double>{-2, -0.5, 0, 0.5, 3}, {5});
  EXPECT_EQ(vals(relu(x)), (std::vector<double>{0, 0, 0, 0.5, 3}));
  const std::vector<double> t = vals(graphward::tanh(x)), s = vals(sigmoid(x));
  const std::vector<double> xs{-2, -0.5, 0, 0.5, 3};
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_DOUBLE_EQ(t[i], std::tanh(xs[i]));
    EXPECT_DOUBLE_EQ(s[i], 1 / (1 + std::exp(-xs[i])));
  }
  // Saturation gives 0 and 1, never NaN.
  const Tensor big = from_vector(std::vector<float>{-1000, 1000}, {2});
  EXPECT_EQ(vals(sigmoid(big)), (std::vector<double>{0, 1}));
  EXPECT_EQ(vals(graphward::tanh(big)), (std::vector<double>{-1, 1}));
}

TEST(OpsForwardCpu, SumMeanAndMseLossAreScalars) {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector(std::vector<float>{1, 1, 1, 1, 1, 1}, {2, 3});
  EXPECT_EQ(sum(a).shape(), Shape({}));
  EXPECT_EQ(sum(a).item(), 21);
  EXPECT_EQ(mean(a).item(), 3.5);
  EXPECT_FLOAT_EQ(static_cast<float>(mse_loss(a, b).item()), (0 + 1 + 4 + 9 + 16 + 25) / 6.0f);
}

// ---- gradients against finite differences (float64) -------------------------------------------

TEST(OpsGradcheckCpu, Matmul) {
  const double err = gradcheck_error([](const Inputs& in) { return matmul(in[0], in[1]); },
                                     [](const Tensor& g, const Inputs& in) {
                                       Tensor ga, gb;
                                       matmul_backward(g, in[0], in[1], {&ga}, {&gb});
                                       return Inputs{ga, gb};
                                     },
                                     {randn({3, 5}, 1, f64()), randn({5, 4}, 2, f64())});
  EXPECT_LT(err, 1e-7);
}

TEST(OpsGradcheckCpu, LinearWithAndWithoutBias) {
  const Inputs in{randn({4, 6}, 3, f64()), randn({5, 6}, 4, f64()), randn({5}, 5, f64())};
  const double with_bias = gradcheck_error([](const Inputs& x) { return linear(x[0], x[1], x[2]); },
                                           [](const Tensor& g, const Inputs& x) {
                                             Tensor gx, gw, gb;
                                             linear_backward(g, x[0], x[1], {&gx}, {&gw}, {&gb});
                                             return Inputs{gx, gw, gb};
                                           },
                                           in);
  EXPECT_LT(with_bias, 1e-7);
  const double without = gradcheck_error([](const Inputs& x) { return linear(x[0], x[1]); },
                                         [](const Tensor& g, const Inputs& x) {
                                           Tensor gx, gw;
                                           linear_backward(g, x[0], x[1], {&gx}, {&gw});
                                           return Inputs{gx, gw};
                                         },
                                         {in[0], in[1]});
  EXPECT_LT(without, 1e-7);
}

struct BinaryCase {
  const char* name;
  Tensor (*forward)(const Tensor&, const Tensor&);
  void (*backward)(const Tensor&, const Tensor&, const Tensor&, GradSlot, GradSlot);
};

TEST(OpsGradcheckCpu, AddSubMulForEveryBroadcastForm) {
  const BinaryCase cases[] = {
      {"add", add, add_backward}, {"sub", sub, sub_backward}, {"mul", mul, mul_backward}};
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 4}, {1, 4}}, {{4}, {3, 4}}, {{1, 4}, {2, 3, 4}},
      // trailing dimensions repeated over the leading ones, either operand
      {{2, 3, 4}, {3, 4}}, {{3, 4}, {2, 3, 4}}, {{2, 2, 3, 4}, {2, 3, 4}}, {{2, 1, 4}, {1, 4}}};
  std::uint64_t seed = 10;
  for (const BinaryCase& c : cases) {
    for (const auto& [sa, sb] : shapes) {
      const double err = gradcheck_error([&](const Inputs& in) { return c.forward(in[0], in[1]); },
                                         [&](const Tensor& g, const Inputs& in) {
                                           Tensor ga, gb;
                                           c.backward(g, in[0], in[1], {&ga}, {&gb});
                                           return Inputs{ga, gb};
                                         },
                                         {randn(sa, seed, f64()), randn(sb, seed + 1, f64())});
      seed += 2;
      EXPECT_LT(err, 1e-7) << c.name << " " << shape_str(sa) << " with " << shape_str(sb);
    }
  }
}

TEST(OpsGradcheckCpu, ScalarForms) {
  for (double s : {-1.5, 0.0, 2.25}) {
    const double err_add = gradcheck_error([s](const Inputs& in) { return add(in[0], s); },
                                           [](const Tensor& g, const Inputs&) {
                                             Tensor ga;
                                             scale_backward(g, 1.0, {&ga});
                                             return Inputs{ga};
                                           },
                                           {randn({3, 2}, 7, f64())});
    const double err_mul = gradcheck_error([s](const Inputs& in) { return mul(in[0], s); },
                                           [s](const Tensor& g, const Inputs&) {
                                             Tensor ga;
                                             scale_backward(g, s, {&ga});
                                             return Inputs{ga};
                                           },
                                           {randn({3, 2}, 8, f64())});
    EXPECT_LT(err_add, 1e-7);
    EXPECT_LT(err_mul, 1e-7);
  }
}

TEST(OpsGradcheckCpu, Activations) {
  struct Act {
    const char* name;
    Tensor (*forward)(const Tensor&);
    void (*backward)(const Tensor&, const Tensor&, GradSlot);
  };
  const Act acts[] = {{"relu", relu, relu_backward},
                      {"tanh", graphward::tanh, tanh_backward},
                      {"sigmoid", sigmoid, sigmoid_backward}};
  for (const Act& a : acts) {
    const double err = gradcheck_error([&](const Inputs& in) { return a.forward(in[0]); },
                                       [&](const Tensor& g, const Inputs& in) {
                                         Tensor gx;
                                         a.backward(g, a.forward(in[0]), {&gx});
                                         return Inputs{gx};
                                       },
                                       {randn({4, 7}, 21, f64())});
    EXPECT_LT(err, 1e-7) << a.name;
  }
}

TEST(OpsForwardCpu, GeluIsTheTanhApproximation) {
  const std::vector<double> xs{-6, -2, -0.5, 0, 0.5, 3, 8};
  const std::vector<double> y = vals(gelu(from_vector(xs, {7})));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_DOUBLE_EQ(y[i], want) << v;
  }
  EXPECT_EQ(y[3], 0.0);
  EXPECT_NEAR(y[0], 0.0, 1e-10);  // saturates to 0 and to x, never NaN
  EXPECT_DOUBLE_EQ(y[6], 8.0);
  EXPECT_EQ(vals(gelu(from_vector(std::vector<float>{-1e30f, 1e30f}, {2}))),
            (std::vector<double>{0.0, 1e30f}));
}

TEST(OpsGradcheckCpu, Gelu) {
  const double err = gradcheck_error([](const Inputs& in) { return gelu(in[0]); },
                                     [](const Tensor& g, const Inputs& in) {
                                       Tensor gx;
                                       gelu_backward(g, in[0], {&gx});
                                       return Inputs{gx};
                                     },
                                     {mul(randn({4, 7}, 22, f64()), 2.0)});
  EXPECT_LT(err, 1e-7);
}

TEST(OpsForwardCpu, LinearWithAnActivationIsTheActivationOfTheLinear) {
  const Tensor x = randn({5, 6}, 31, f64()), w = randn({4, 6}, 32, f64()),
               b = randn({4}, 33, f64());
  EXPECT_EQ(vals(linear(x, w, b, Activation::kNone)), vals(linear(x, w, b)));
  EXPECT_EQ(vals(linear(x, w, b, Activation::kRelu)), vals(relu(linear(x, w, b))));
  EXPECT_EQ(vals(linear(x, w, b, Activation::kGelu)), vals(gelu(linear(x, w, b))));
  EXPECT_EQ(vals(linear(x, w, Tensor(), Activation::kGelu)), vals(gelu(linear(x, w))));
}

TEST(OpsGradcheckCpu, LinearWithAFusedActivation) {
  struct Case {
    Activation act;
    bool bias;
  };
  for (const Case c : {Case{Activation::kRelu, true}, Case{Activation::kRelu, false},
                       Case{Activation::kGelu, true}, Case{Activation::kGelu, false}}) {
    Inputs in{randn({4, 6}, 41, f64()), randn({5, 6}, 42, f64())};
    if (c.bias) in.push_back(randn({5}, 43, f64()));
    const Activation act = c.act;
    auto forward = [act](const Inputs& x) {
      return linear(x[0], x[1], x.size() > 2 ? x[2] : Tensor(), act);
    };
    // The tensor the node saves: the output (ReLU) or the pre-activation (GELU).
    auto saved = [act](const Inputs& x) {
      const Tensor z = linear(x[0], x[1], x.size() > 2 ? x[2] : Tensor());
      return act == Activation::kRelu ? relu(z) : z;
    };
    const double err = gradcheck_error(
        forward,
        [&](const Tensor& g, const Inputs& x) {
          Tensor gx, gw, gb;
          linear_act_backward(g, x[0], x[1], saved(x), act, {&gx}, {&gw},
                              x.size() > 2 ? GradSlot{&gb} : GradSlot{});
          Inputs out{gx, gw};
          if (x.size() > 2) out.push_back(gb);
          return out;
        },
        in);
    EXPECT_LT(err, 1e-7) << "act " << static_cast<int>(act) << " bias " << c.bias;
  }
}

TEST(OpsForwardCpu, SoftmaxLogSoftmaxAndCrossEntropyMatchTheirDefinitions) {
  const std::vector<double> xs{1, 2, 3, -1, 0, 1000};  // a huge logit: stable, no inf or NaN
  const Tensor x = from_vector(xs, {2, 3});
  const std::vector<double> p = vals(softmax(x)), lp = vals(log_softmax(x));
  for (int r = 0; r < 2; ++r) {
    const double m = std::max({xs[3 * r], xs[3 * r + 1], xs[3 * r + 2]});
    double s = 0;
    for (int j = 0; j < 3; ++j) s += std::exp(xs[3 * r + j] - m);
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(p[3 * r + j], std::exp(xs[3 * r + j] - m) / s, 1e-15);
      EXPECT_NEAR(lp[3 * r + j], xs[3 * r + j] - m - std::log(s), 1e-12);
    }
  }
  const Tensor targets = from_vector(std::vector<std::int32_t>{2, 0}, {2});
  const double ce = cross_entropy(x, targets).item();
  EXPECT_NEAR(ce, -(lp[2] + lp[3]) / 2, 1e-12);
  EXPECT_EQ(cross_entropy(x, targets).shape(), Shape({}));
}

TEST(OpsGradcheckCpu, SoftmaxLogSoftmaxAndCrossEntropy) {
  for (bool log : {false, true}) {
    const double err = gradcheck_error(
        [log](const Inputs& in) { return log ? log_softmax(in[0]) : softmax(in[0]); },
        [log](const Tensor& g, const Inputs& in) {
          Tensor gx;
          if (log) {
            log_softmax_backward(g, log_softmax(in[0]), {&gx});
          } else {
            softmax_backward(g, softmax(in[0]), {&gx});
          }
          return Inputs{gx};
        },
        {randn({3, 5}, 51, f64())});
    EXPECT_LT(err, 1e-7) << (log ? "log_softmax" : "softmax");
  }
  const Tensor targets = from_vector(std::vector<std::int32_t>{4, 0, 2, 2}, {4});
  const double err = gradcheck_error(
      [&](const Inputs& in) { return cross_entropy(in[0], targets); },
      [&](const Tensor& g, const Inputs& in) {
        Tensor gx;
        // Each row's (maximum, log Σ exp(x − maximum)).
        const std::vector<double> x = vals(in[0]);
        std::vector<double> row(8);
        for (int r = 0; r < 4; ++r) {
          double m = x[5 * r], s = 0;
          for (int j = 1; j < 5; ++j) m = std::max(m, x[5 * r + j]);
          for (int j = 0; j < 5; ++j) s += std::exp(x[5 * r + j] - m);
          row[2 * r] = m;
          row[2 * r + 1] = std::log(s);
        }
        cross_entropy_backward(g, in[0], from_vector(row, {4, 2}), targets, {&gx});
        return Inputs{gx};
      },
      {mul(randn({4, 5}, 52, f64()), 2.0)});
  EXPECT_LT(err, 1e-7) << "cross_entropy";
}

TEST(OpsForwardCpu, CrossEntropyOverTheFirstClassesIsCrossEntropyOfTheirColumns) {
  testing::expect_cross_entropy_over_classes_as_over_their_copy(Device::cpu(), DType::kFloat32);
  testing::expect_cross_entropy_over_classes_as_over_their_copy(Device::cpu(), DType::kBFloat16);
  // On the CPU a target past the classes (though inside the row) is refused by name.
  const Tensor x = randn({2, 5}, 3);
  GW_EXPECT_ERROR((void)cross_entropy(x, from_vector(std::vector<std::int32_t>{1, 4}, {2}), 4),
                  "cross_entropy", "target");
}

TEST(AutogradCpu, CrossEntropyTrainsThroughTheTapeAndTargetsGetNoGradient) {
  const Tensor w = randn({3, 4}, 53, f64()).set_requires_grad(true);
  const Tensor x = randn({6, 4}, 54, f64());
  const Tensor targets = from_vector(std::vector<std::int32_t>{0, 1, 2, 0, 1, 2}, {6});
  const Tensor loss = cross_entropy(linear(x, w), targets);
  ASSERT_TRUE(loss.grad_fn());
  EXPECT_EQ(loss.grad_fn()->name(), "cross_entropy");
  backward(loss);
  ASSERT_TRUE(w.grad().defined());
  // The gradient against the composed definition: -mean(log_softmax(xWᵀ)[target]).
  const Tensor w2 = randn({3, 4}, 53, f64()).set_requires_grad(true);
  const Tensor lp = log_softmax(linear(x, w2));
  std::vector<double> onehot(18, 0.0);
  for (int r = 0; r < 6; ++r) onehot[3 * r + r % 3] = -1.0 / 6;
  backward(sum(mul(lp, from_vector(onehot, {6, 3}))));
  EXPECT_LT(testing::rel_error(w.grad(), w2.grad()), 1e-12);
}

TEST(OpsForwardCpu, LayerNormNormalizesEachRowThenScalesAndShifts) {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, -1, -1, 1, 1}, {2, 4});
  const Tensor w = from_vector(std::vector<double>{1, 2, 1, 1}, {4});
  const Tensor b = from_vector(std::vector<double>{0, 0, 0, 10}, {4});
  const std::vector<double> y = vals(layer_norm(x, w, b, 1e-5));
  const double r0 = 1 / std::sqrt(1.25 + 1e-5), r1 = 1 / std::sqrt(1.0 + 1e-5);
  const std::vector<double> want{-1.5 * r0, -0.5 * r0 * 2, 0.5 * r0, 1.5 * r0 + 10,
                                 -r1,       -r1 * 2,       r1,       r1 + 10};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-12) << i;
  EXPECT_EQ(layer_norm(x, w, Tensor()).shape(), Shape({2, 4}));
}

// add_layer_norm on the CPU is add then layer_norm, recorded as the two: the same values and the
// same gradients, through both of its outputs.
TEST(OpsForwardCpu, AddLayerNormIsAddThenLayerNorm) {
  for (const bool with_bias : {true, false}) {
   for (const Shape& rs : {Shape{3, 2, 6}, Shape{2, 6}, Shape{6}}) {  // x's shape, trailing dims
    auto run = [&](bool fused) {
      const Tensor x = randn({3, 2, 6}, 71, f64()).set_requires_grad(true);
      const Tensor r = randn(rs, 72, f64()).set_requires_grad(true);
      const Tensor w = add(randn({6}, 73, f64()), 1.0).detach().set_requires_grad(true);
      const Tensor b = with_bias ? randn({6}, 74, f64()).set_requires_grad(true) : Tensor();
      Tensor sum, normed;
      if (fused) {
        const AddLayerNorm o = add_layer_norm(x, r, w, b, 1e-5);
        sum = o.sum;
        normed = o.normed;
      } else {
        sum = add(x, r);
        normed = layer_norm(sum, w, b, 1e-5);
      }
      backward({normed, sum}, {randn({3, 2, 6}, 75, f64()), randn({3, 2, 6}, 76, f64())});
      std::vector<std::vector<double>> out{vals(sum), vals(normed), vals(x.grad()), vals(r.grad()),
                                           vals(w.grad())};
      if (with_bias) out.push_back(vals(b.grad()));
      return out;
    };
    EXPECT_EQ(run(true), run(false)) << "bias " << with_bias << " residual " << shape_str(rs);
   }
  }
  // Bad input: the whole family refused by name, before anything is computed.
  const Tensor x = randn({4, 8}, 1), w = randn({8}, 2);
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 7}, 3), w, Tensor()), "add_layer_norm", "residual",
                  "[4, 7]");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({8, 4}, 3), w, Tensor()), "add_layer_norm", "residual");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({2, 4, 8}, 3), w, Tensor()), "add_layer_norm",
                  "residual", "trailing");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({7}, 3), w, Tensor()), "add_layer_norm", "residual");
  GW_EXPECT_ERROR(add_layer_norm(x, Tensor(), w, Tensor()), "add_layer_norm", "residual");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 8}, 3, f64()), w, Tensor()), "add_layer_norm",
                  "residual");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 8}, 3), randn({7}, 4), Tensor()), "add_layer_norm",
                  "weight", "[8]");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 8}, 3), w, randn({9}, 5)), "add_layer_norm", "bias");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 8}, 3), w, Tensor(), 0.0), "add_layer_norm", "eps");
  GW_EXPECT_ERROR(add_layer_norm(x, randn({4, 8}, 3), w, Tensor(), std::nan("")), "add_layer_norm",
                  "eps");
}

TEST(OpsGradcheckCpu, LayerNormWithAndWithoutBias) {
  for (bool with_bias : {true, false}) {
    const Tensor x = randn({3, 2, 6}, 61, f64()), w = add(randn({6}, 62, f64()), 1.0);
    const Inputs in = with_bias ? Inputs{x, w, randn({6}, 63, f64())} : Inputs{x, w};
    const double err = gradcheck_error(
        [](const Inputs& x) { return layer_norm(x[0], x[1], x.size() > 2 ? x[2] : Tensor()); },
        [](const Tensor& g, const Inputs& x) {
          // mean and rstd from the definition, as the forward saves them.
          const std::vector<double> xv = vals(x[0]);
          std::vector<double> m(6), r(6);
          for (int i = 0; i < 6; ++i) {
            double s = 0, v = 0;
            for (int j = 0; j < 6; ++j) s += xv[6 * i + j];
            s /= 6;
            for (int j = 0; j < 6; ++j) v += (xv[6 * i + j] - s) * (xv[6 * i + j] - s);
            m[i] = s;
            r[i] = 1 / std::sqrt(v / 6 + 1e-5);
          }
          Tensor gx, gw, gb;
          layer_norm_backward(g, x[0], x[1], from_vector(m, {6}), from_vector(r, {6}), {&gx}, {&gw},
                              x.size() > 2 ? GradSlot{&gb} : GradSlot{});
          Inputs out{gx, gw};
          if (x.size() > 2) out.push_back(gb);
          return out;
        },
        in);
    EXPECT_LT(err, 1e-7) << "bias " << with_bias;
  }
}

TEST(OpsForwardCpu, EmbeddingPicksRowsAndAddsTheirGradients) {
  const Tensor table = from_vector(std::vector<double>{0, 1, 10, 11, 20, 21}, {3, 2});
  const Tensor ids = from_vector(std::vector<std::int32_t>{2, 0, 2, 1}, {2, 2});
  const Tensor y = embedding(table, ids);
  EXPECT_EQ(y.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(vals(y), (std::vector<double>{20, 21, 0, 1, 20, 21, 10, 11}));
  Tensor gt;
  embedding_backward(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}), table,
                     ids, {&gt});
  EXPECT_EQ(vals(gt), (std::vector<double>{3, 4, 7, 8, 1 + 5, 2 + 6}));
  GW_EXPECT_ERROR(embedding(table, from_vector(std::vector<std::int32_t>{3}, {1})), "embedding",
                  "id 0 is 3", "[0, 3)");
  GW_EXPECT_ERROR(embedding(table, zeros({2})), "embedding", "int32");
  // Through the tape: only the table gets a gradient.
  const Tensor p = randn({5, 3}, 64, f64()).set_requires_grad(true);
  backward(sum(embedding(p, from_vector(std::vector<std::int32_t>{1, 1, 4}, {3}))));
  EXPECT_EQ(vals(p.grad()), (std::vector<double>{0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
}

TEST(OpsForwardCpu, DropoutDrawsFromItsGeneratorAndTheSameSeedReproducesIt) {
  const Tensor x = add(mul(randn({100, 100}, 71), 0.0), 2.0);  // all 2s
  Generator gen(Device::cpu(), 1234);
  EXPECT_EQ(gen.offset(), 0u);
  const std::vector<double> y = vals(dropout(x, 0.3, gen));
  EXPECT_EQ(gen.offset(), 10000u);
  std::size_t kept = 0;
  for (double v : y) {
    EXPECT_TRUE(v == 0.0 || std::abs(v - 2.0 / 0.7) < 1e-6) << v;
    kept += v != 0.0;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 10000, 0.7, 0.02);
  // The next draw differs; a generator made again with the seed reproduces both.
  const std::vector<double> y2 = vals(dropout(x, 0.3, gen));
  EXPECT_NE(y2, y);
  Generator again(Device::cpu(), 1234);
  EXPECT_EQ(vals(dropout(x, 0.3, again)), y);
  EXPECT_EQ(vals(dropout(x, 0.3, again)), y2);
  Generator other(Device::cpu(), 1235);
  EXPECT_NE(vals(dropout(x, 0.3, other)), y);
  EXPECT_EQ(vals(dropout(x, 0.0, gen)), vals(x));  // p = 0 keeps everything
  GW_EXPECT_ERROR(dropout(x, 1.0, gen), "dropout", "p is 1", "[0, 1)");
  GW_EXPECT_ERROR(dropout(x, -0.1, gen), "dropout", "[0, 1)");
}

TEST(AutogradCpu, DropoutsGradientIsItsMask) {
  const Tensor x = randn({8, 16}, 72, f64()).set_requires_grad(true);
  Generator gen(Device::cpu(), 7);
  const Tensor y = dropout(x, 0.5, gen);
  backward(sum(y));
  const std::vector<double> g = vals(x.grad()), yv = vals(y), xv = vals(x);
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i], yv[i] == 0.0 ? 0.0 : 2.0) << i;
    if (yv[i] != 0.0) {
      EXPECT_DOUBLE_EQ(yv[i], 2.0 * xv[i]);
    }
  }
}

TEST(OpsGradcheckCpu, SumMeanAndMseLoss) {
  const double err_sum = gradcheck_error([](const Inputs& in) { return sum(in[0]); },
                                         [](const Tensor& g, const Inputs& in) {
                                           Tensor gx;
                                           sum_backward(g, in[0], {&gx});
                                           return Inputs{gx};
                                         },
                                         {randn({3, 5}, 31, f64())});
  const double err_mean = gradcheck_error([](const Inputs& in) { return mean(in[0]); },
                                          [](const Tensor& g, const Inputs& in) {
                                            Tensor gx;
                                            mean_backward(g, in[0], {&gx});
                                            return Inputs{gx};
                                          },
                                          {randn({3, 5}, 32, f64())});
  const double err_mse = gradcheck_error([](const Inputs& in) { return mse_loss(in[0], in[1]); },
                                         [](const Tensor& g, const Inputs& in) {
                                           Tensor gp, gt;
                                           mse_loss_backward(g, in[0], in[1], {&gp}, {&gt});
                                           return Inputs{gp, gt};
                                         },
                                         {randn({4, 3}, 33, f64()), randn({4, 3}, 34, f64())});
  EXPECT_LT(err_sum, 1e-7);
  EXPECT_LT(err_mean, 1e-7);
  EXPECT_LT(err_mse, 1e-7);
}

TEST(OpsGradcheckCpu, ComposedMlpLoss) {
  // loss = mse(tanh(linear(relu(linear(x, w1, b1)), w2, b2)), target), checked end to end with
  // the backward functions chained by hand.
  const Tensor x = randn({5, 4}, 41, f64()), target = randn({5, 2}, 42, f64());
  auto forward = [&](const Inputs& p) {
    const Tensor h = relu(linear(x, p[0], p[1]));
    return mse_loss(graphward::tanh(linear(h, p[2], p[3])), target);
  };
  auto backward = [&](const Tensor& g, const Inputs& p) {
    const Tensor z1 = linear(x, p[0], p[1]);
    const Tensor h = relu(z1);
    const Tensor y = graphward::tanh(linear(h, p[2], p[3]));
    Tensor gy, gz2, gh, gz1, gw1, gb1, gw2, gb2;
    mse_loss_backward(g, y, target, {&gy});
    tanh_backward(gy, y, {&gz2});
    linear_backward(gz2, h, p[2], {&gh}, {&gw2}, {&gb2});
    relu_backward(gh, h, {&gz1});
    linear_backward(gz1, x, p[0], {}, {&gw1}, {&gb1});
    return Inputs{gw1, gb1, gw2, gb2};
  };
  const double err = gradcheck_error(forward, backward,
                                     {randn({3, 4}, 43, f64()), randn({3}, 44, f64()),
                                      randn({2, 3}, 45, f64()), randn({2}, 46, f64())});
  EXPECT_LT(err, 1e-6);
}

// ---- gradient slots: write, accumulate, skip ----------------------------------------------------

TEST(GradSlotsCpu, OverwriteIgnoresOldContentsAndAccumulateAdds) {
  const Tensor dy = from_vector(std::vector<float>{1, 2, 3}, {3});
  const Tensor y = from_vector(std::vector<float>{1, -1, 2}, {3});  // relu output
  Tensor g = full({3}, 100.0);
  const auto v0 = g.version();
  relu_backward(dy, y, {&g, /*accumulate=*/false});
  EXPECT_EQ(vals(g), (std::vector<double>{1, 0, 3}));
  EXPECT_GT(g.version(), v0);
  relu_backward(dy, y, {&g, /*accumulate=*/true});
  EXPECT_EQ(vals(g), (std::vector<double>{2, 0, 6}));
}

TEST(GradSlotsCpu, UndefinedSlotIsAllocatedAndNullSlotIsSkipped) {
  const Tensor a = randn({2, 3}, 1), b = randn({3, 4}, 2), dy = randn({2, 4}, 3);
  Tensor ga;
  matmul_backward(dy, a, b, {&ga}, {});
  ASSERT_TRUE(ga.defined());
  EXPECT_EQ(ga.shape(), a.shape());
  // An undefined slot is written, even when `accumulate` is set (there is nothing to add to).
  Tensor ga2;
  matmul_backward(dy, a, b, {&ga2, true}, {});
  EXPECT_EQ(vals(ga2), vals(ga));
}

TEST(GradSlotsCpu, SharingSlotsReceiveGradOutItselfOnlyWhereTheGradientEqualsIt) {
  const Tensor a = randn({2, 3}, 1), b = randn({2, 3}, 2), row = randn({3}, 4),
               dy = randn({2, 3}, 3);
  // add: both full-shape gradients equal dy: passed through, sharing dy's storage.
  Tensor ga, gb;
  add_backward(dy, a, b, {&ga, false, true}, {&gb, false, true});
  EXPECT_EQ(ga.raw_data(), dy.raw_data());
  EXPECT_EQ(gb.raw_data(), dy.raw_data());
  // Without may_share: copies.
  Tensor ca, cb;
  add_backward(dy, a, b, {&ca}, {&cb});
  EXPECT_NE(ca.raw_data(), dy.raw_data());
  EXPECT_EQ(vals(ca), vals(dy));
  // sub: only the first operand's gradient equals dy; the second is -dy, computed.
  Tensor sa, sb;
  sub_backward(dy, a, b, {&sa, false, true}, {&sb, false, true});
  EXPECT_EQ(sa.raw_data(), dy.raw_data());
  EXPECT_NE(sb.raw_data(), dy.raw_data());
  EXPECT_EQ(vals(sb), vals(mul(dy, -1.0)));
  // A row operand's gradient is a sum, never shared; a defined or accumulating slot is never
  // replaced.
  Tensor gr;
  add_backward(dy, a, row, {}, {&gr, false, true});
  EXPECT_NE(gr.raw_data(), dy.raw_data());
  Tensor held = zeros({2, 3});
  const void* held_data = held.raw_data();
  add_backward(dy, a, b, {&held, true, true}, {});
  EXPECT_EQ(held.raw_data(), held_data);
  EXPECT_EQ(vals(held), vals(dy));
}

TEST(GradSlotsCpu, ActivationBackwardWritesInPlaceOnlyIntoAUniqueGradOut) {
  const Tensor y = relu(randn({3, 5}, 7));
  const Tensor dy_values = randn({3, 5}, 8);
  Tensor expected;
  relu_backward(dy_values, y, {&expected});
  // A unique grad_out and a sharing slot: computed in place, the slot takes grad_out's memory.
  Tensor dy = dy_values.clone();
  const void* dy_data = dy.raw_data();
  Tensor dx;
  relu_backward(dy, y, {&dx, false, true});
  EXPECT_EQ(dx.raw_data(), dy_data);
  EXPECT_EQ(vals(dx), vals(expected));
  // Another handle on grad_out's storage (here: the caller's copy): never in place.
  Tensor dy2 = dy_values.clone();
  const Tensor other_handle = dy2.detach();
  Tensor dx2;
  relu_backward(dy2, y, {&dx2, false, true});
  EXPECT_NE(dx2.raw_data(), dy2.raw_data());
  EXPECT_EQ(vals(dy2), vals(dy_values));  // untouched
  EXPECT_EQ(vals(dx2), vals(expected));
  // Without may_share: never in place.
  Tensor dy3 = dy_values.clone();
  Tensor dx3;
  relu_backward(dy3, y, {&dx3});
  EXPECT_NE(dx3.raw_data(), dy3.raw_data());
  EXPECT_EQ(vals(dy3), vals(dy_values));
}

// A gradient an op passes through (add's operands, sub's first, reshape's, an activation's in
// place) into a buffer that a later gradient is added into: the backward executor may let that
// buffer take the step's gradient itself only where nothing else sees it. Every other gradient of
// the step — a row operand's sum read from it, the other operand's shared copy, a seed the caller
// still holds — keeps its value. float64, against the gradients written out by hand.
TEST(GradSlotsCpu, APassedThroughGradientThatLaterGradientsAddIntoIsNoOtherGradient) {
  const Tensor c = randn({2, 3}, 11, f64()), d = randn({2, 3}, 12, f64()),
               e = randn({2, 3}, 13, f64()), k = randn({2, 3}, 14, f64());
  const Tensor p = randn({2, 3}, 15, f64()).set_requires_grad(true),
               q = randn({2, 3}, 16, f64()).set_requires_grad(true),
               r = randn({3}, 17, f64()).set_requires_grad(true);
  auto run = [&](const std::function<Tensor(const Tensor&, const Tensor&)>& loss) {
    for (const Tensor* t : {&p, &q, &r}) t->grad() = Tensor();
    backward(loss(mul(p, 2.0), mul(q, 3.0)));  // a = 2p and b = 3q: gradient buffers, no leaves
  };
  auto dot = [](const Tensor& x, const Tensor& w) { return sum(mul(x, w)); };
  auto hand = [](const Tensor& t) {
    NoGradGuard no_grad;
    return vals(t);
  };
  auto twice = [](const Tensor& t) { return mul(t, 2.0); };
  {  // add: a's buffer takes the gradient (b's is a row: summed from it)
    run([&](const Tensor& a, const Tensor&) { return add(dot(add(a, r), c), dot(a, d)); });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
    const std::vector<double> cv = vals(c);
    EXPECT_EQ(vals(r.grad()), (std::vector<double>{cv[0] + cv[3], cv[1] + cv[4], cv[2] + cv[5]}));
  }
  {  // add of a constant: a's buffer takes it; then a's own use adds in
    run([&](const Tensor& a, const Tensor&) { return add(dot(add(a, k), c), dot(a, d)); });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
  }
  {  // add of two gradient buffers both added into later: one copy at least, neither corrupted
    run([&](const Tensor& a, const Tensor& b) {
      return add(add(dot(add(a, b), c), dot(a, d)), dot(b, e));
    });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
    EXPECT_EQ(vals(q.grad()), hand(mul(add(c, e), 3.0)));
  }
  {  // add whose other operand shares the gradient and is read later: a copies
    run([&](const Tensor& a, const Tensor& b) { return add(dot(add(a, b), c), dot(a, d)); });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
    EXPECT_EQ(vals(q.grad()), hand(mul(c, 3.0)));
  }
  {  // sub: the first operand's gradient passed through, the second's negated
    run([&](const Tensor& a, const Tensor& b) { return add(dot(sub(a, b), c), dot(a, d)); });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
    EXPECT_EQ(vals(q.grad()), hand(mul(c, -3.0)));
  }
  {  // reshape: a view of the gradient
    run([&](const Tensor& a, const Tensor&) {
      return add(dot(reshape(a, {3, 2}), reshape(c, {3, 2})), dot(a, d));
    });
    EXPECT_EQ(vals(p.grad()), hand(twice(add(c, d))));
  }
  {  // an activation's gradient computed in place
    run([&](const Tensor& a, const Tensor&) { return add(dot(relu(a), c), dot(a, d)); });
    const std::vector<double> pv = vals(p), cv = vals(c), dv = vals(d);
    std::vector<double> want(6);
    for (int i = 0; i < 6; ++i) want[i] = 2.0 * ((2.0 * pv[i] > 0 ? cv[i] : 0.0) + dv[i]);
    EXPECT_EQ(vals(p.grad()), want);
  }
  {  // a seed the caller holds is passed through and must stay the caller's
    const Tensor seed = randn({2, 3}, 18, f64()), seed_copy = seed.clone();
    for (const Tensor* t : {&p, &q, &r}) t->grad() = Tensor();
    const Tensor a = mul(p, 2.0);
    const Tensor y = add(a, k);
    backward({y, dot(a, d)}, {seed, ones({}, f64())});
    EXPECT_EQ(vals(seed), vals(seed_copy));
    EXPECT_EQ(vals(p.grad()), hand(twice(add(seed, d))));
  }
}

TEST(OpsInPlaceCpu, CopyOverwritesKeepsTheAddressAndBumpsTheVersion) {
  const Tensor dst = zeros({2, 3}), src = randn({2, 3}, 1);
  const void* where = dst.raw_data();
  const std::uint64_t v = dst.version();
  copy_(dst, src);
  EXPECT_EQ(vals(dst), vals(src));
  EXPECT_EQ(dst.raw_data(), where);
  EXPECT_GT(dst.version(), v);
  GW_EXPECT_ERROR(copy_(dst, randn({3, 2}, 2)), "copy_", "shapes differ");
  const Tensor p = zeros({2}).set_requires_grad(true);
  GW_EXPECT_ERROR(copy_(p, randn({2}, 3)), "copy_", "NoGradGuard");
  // int32 (class targets into a static slot) and a dtype mismatch.
  const Tensor ids = from_vector(std::vector<std::int32_t>{0, 0, 0}, {3});
  copy_(ids, from_vector(std::vector<std::int32_t>{4, 5, 6}, {3}));
  EXPECT_EQ(ids.to_vector<std::int32_t>(), (std::vector<std::int32_t>{4, 5, 6}));
  GW_EXPECT_ERROR(copy_(ids, zeros({3})), "copy_", "int32[3]", "float32[3]", "one dtype");
}

TEST(GradSlotsCpu, AccumulateOverMicroBatchesEqualsOneBigBatch) {
  // Σ over two halves of dW equals dW over the whole batch: the micro-batch contract.
  const Tensor x = randn({8, 5}, 1, f64()), w = randn({3, 5}, 2, f64()),
               dy = randn({8, 3}, 3, f64());
  Tensor gw_full;
  linear_backward(dy, x, w, {}, {&gw_full});
  const std::vector<double> xv = x.to_vector<double>(), dyv = dy.to_vector<double>();
  Tensor gw = zeros({3, 5}, f64());
  for (int half = 0; half < 2; ++half) {
    const Tensor xh = from_vector(
        std::vector<double>(xv.begin() + half * 20, xv.begin() + half * 20 + 20), {4, 5});
    const Tensor dh = from_vector(
        std::vector<double>(dyv.begin() + half * 12, dyv.begin() + half * 12 + 12), {4, 3});
    linear_backward(dh, xh, w, {}, {&gw, true});
  }
  EXPECT_LT(testing::rel_error(gw, gw_full), 1e-12);
}

}  // namespace
}  // namespace graphward
