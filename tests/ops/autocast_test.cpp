// Autocast (Note [Autocast], engine/ops/autocast.h) on the CPU backend: which dtype each op runs in
// inside the scope, a parameter cast once whatever its uses, its gradient float32 and near the
// float32 model's, the scope's nesting and its refusals.
#include "test_util.h"

namespace graphward {
namespace {
constexpr DType kF32 = DType::kFloat32;
constexpr DType kBf16 = DType::kBFloat16;

Tensor param(const Shape& shape, std::uint64_t seed, double scale = 0.3) {
  return mul(randn(shape, seed), scale).detach().set_requires_grad(true);
}

TEST(Autocast, EachOpRunsInTheDtypeThePolicySays) {
  const Tensor x = randn({6, 16}, 1);
  const Tensor w = param({24, 16}, 2), b = param({24}, 3);
  const Tensor ln_w = param({24}, 4), ln_b = param({24}, 5);
  Autocast autocast;
  EXPECT_TRUE(autocast_enabled());
  // Matrix products: bfloat16.
  const Tensor h = linear(x, w, b, Activation::kGelu);
  EXPECT_EQ(h.dtype(), kBf16);
  EXPECT_EQ(matmul(x, transpose(w, 0, 1)).dtype(), kBf16);
  EXPECT_EQ(bmm(reshape(x, {2, 3, 16}), reshape(x, {2, 3, 16}), false, true).dtype(), kBf16);
  const Tensor q = reshape(h, {2, 3, 24});
  EXPECT_EQ(scaled_dot_product_attention(q, q, q, {.causal = true}).dtype(), kBf16);
  EXPECT_EQ(self_attention(randn({6, 24}, 15), 3, 2, {.causal = true}).dtype(), kBf16);
  EXPECT_EQ(conv2d(reshape(x, {1, 6, 4, 4}), randn({2, 6, 3, 3}, 14)).dtype(), kBf16);
  // float32 with bfloat16: float32 — but a layer norm's normalized output is bfloat16 (float32
  // statistics and math; the matrix product it feeds would cast it).
  const Tensor r = randn({6, 24}, 6);
  EXPECT_EQ(add(r, h).dtype(), kF32);
  EXPECT_EQ(mul(h, r).dtype(), kF32);
  EXPECT_EQ(layer_norm(h, ln_w, ln_b).dtype(), kBf16);
  const AddLayerNorm a = add_layer_norm(h, r, ln_w, ln_b);
  EXPECT_EQ(a.sum.dtype(), kF32);
  EXPECT_EQ(a.normed.dtype(), kBf16);
  // One dtype: as given (float32 math; sums and losses float32).
  EXPECT_EQ(add(h, h).dtype(), kBf16);
  EXPECT_EQ(relu(h).dtype(), kBf16);
  EXPECT_EQ(softmax(h).dtype(), kBf16);
  EXPECT_EQ(log_softmax(h).dtype(), kBf16);
  EXPECT_EQ(layer_norm(h, cast(ln_w, kBf16), cast(ln_b, kBf16)).dtype(), kBf16);
  EXPECT_EQ(sum(h).dtype(), kF32);
  EXPECT_EQ(mse_loss(h, h).dtype(), kF32);
  const Tensor targets = from_vector(std::vector<std::int32_t>{0, 5, 2, 23, 7, 1}, {6});
  EXPECT_EQ(cross_entropy(h, targets).dtype(), kF32);
  EXPECT_EQ(layer_norm(r, ln_w, ln_b).dtype(), kBf16);
  EXPECT_EQ(relu(r).dtype(), kF32);
  // float64 is not touched.
  EXPECT_EQ(linear(cast(x, DType::kFloat64), cast(w, DType::kFloat64)).dtype(), DType::kFloat64);
}

TEST(Autocast, AParameterIsCastOnceWhateverItsUsesAndItsGradientIsFloat32) {
  const Tensor w = param({8, 8}, 7), b = param({8}, 8);
  const Tensor x = randn({4, 8}, 9);
  Tensor loss;
  std::size_t casts = 0;
  {
    Autocast autocast;
    Tensor h = x;
    for (int layer = 0; layer < 3; ++layer) h = linear(h, w, b, Activation::kRelu);  // tied
    loss = sum(h);
    casts = autocast.parameter_casts();
  }
  EXPECT_EQ(casts, 2u) << "w and b, once each over three uses";
  EXPECT_EQ(loss.dtype(), kF32);
  backward(loss);
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_EQ(b.grad().dtype(), kF32);
  // Near the float32 model's gradients (bfloat16 products: about 1e-2).
  const Tensor w32 = w.detach().set_requires_grad(true), b32 = b.detach().set_requires_grad(true);
  Tensor h = x;
  for (int layer = 0; layer < 3; ++layer) h = linear(h, w32, b32, Activation::kRelu);
  backward(sum(h));
  EXPECT_LT(testing::rel_error(w.grad(), w32.grad()), 3e-2);
  EXPECT_LT(testing::rel_error(b.grad(), b32.grad()), 3e-2);
  EXPECT_GT(testing::rel_error(w.grad(), w32.grad()), 0.0) << "the products ran in bfloat16";
}

TEST(Autocast, ScopesNestAndEndAndAParameterWrittenInsideIsCastAnew) {
  const Tensor w = param({4, 4}, 10);
  const Tensor x = randn({2, 4}, 11);
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(linear(x, w).dtype(), kF32);
  {
    Autocast on;
    EXPECT_EQ(linear(x, w).dtype(), kBf16);
    {
      Autocast off(DType::kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(autocast_enabled());
      EXPECT_EQ(linear(x, w).dtype(), kF32);
    }
    EXPECT_TRUE(autocast_enabled());
    const Tensor before = linear(x, w);
    {
      NoGradGuard no_grad;
      add_(w, ones({4, 4}), 1.0);  // an optimizer's update inside the scope
    }
    EXPECT_EQ(on.parameter_casts(), 1u);
    (void)linear(x, w);
    EXPECT_EQ(on.parameter_casts(), 2u) << "the parameter written is cast anew";
    (void)linear(x, w);
    EXPECT_EQ(on.parameter_casts(), 2u) << "... once";
    EXPECT_NE(linear(x, w).to_vector<bf16>(), before.to_vector<bf16>());
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(linear(x, w).dtype(), kF32);
}

TEST(Autocast, ParametersGivenUpFrontAreCastAtOnceAsTheirFirstUsesWouldCastThem) {
  testing::expect_upfront_casts_as_lazy_ones(Device::cpu());
}

TEST(Autocast, ALinearLayersParameterGradientsAreFloat32FromItsBfloat16ProductsUnrounded) {
  testing::expect_linear_parameter_gradients_float32(Device::cpu());
}

TEST(Autocast, ALayerNormsOutputIsBfloat16AndItsBackwardReadsABfloat16Gradient) {
  testing::expect_autocast_layer_norm_output_bf16(Device::cpu());
}

TEST(Autocast, ABfloat16ResidualIsWidenedAsTheAddReadsItWithNoCastNode) {
  testing::expect_autocast_residual_widened_as_read(Device::cpu());
}

TEST(Autocast, FloatOtherThanBfloat16IsRefusedByName) {
  GW_EXPECT_ERROR((void)Autocast(DType::kFloat32), "Autocast", "float32", "expected bfloat16",
                  "float16 needs loss scaling");
  GW_EXPECT_ERROR((void)Autocast(DType::kFloat64), "Autocast", "float64", "expected bfloat16");
  EXPECT_FALSE(autocast_enabled()) << "a refused scope leaves none open";
  // Outside the scope, mixed dtypes are refused as before.
  const Tensor h = cast(randn({2, 3}, 12), kBf16);
  GW_EXPECT_ERROR(add(h, randn({2, 3}, 13)), "add", "different dtypes");
}

}  // namespace
}  // namespace graphward
