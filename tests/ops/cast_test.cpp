// bfloat16 storage and cast on the CPU backend: rounding (to nearest, ties to even, NaN, infinity,
// overflow), conversions both ways and their gradient, creation functions, and the refusal of
// bfloat16 by the CPU backend's other ops (the elementwise ops take it on CUDA), by the ops that
// do not take it yet and by the optimizers.
#include <bit>
#include <cmath>
#include <limits>

#include "graphward/engine/backward/optim.h"
#include "graphward/engine/tape/autograd.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::values;

std::uint16_t bits_of(float f) {
  return bf16::from_float(f).bits;
}

TEST(BFloat16, RoundsToNearestTiesToEvenAndKeepsSpecialValues) {
  EXPECT_EQ(bits_of(1.0f), 0x3F80);
  EXPECT_EQ(bits_of(-2.0f), 0xC000);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f), 0x3F80);             // halfway, the even neighbour is below
  EXPECT_EQ(bits_of(1.0f + 3 * 0x1p-8f), 0x3F82);         // halfway, the even neighbour is above
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // past halfway
  EXPECT_EQ(bits_of(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bits_of(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(bits_of(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(bits_of(1e-40f), std::bit_cast<std::uint32_t>(1e-40f) >> 16);  // a denormal
  for (float f : {0.15625f, -3.5f, 65280.0f}) {  // exactly representable: unchanged
    EXPECT_EQ(bf16::from_float(f).to_float(), f);
  }
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
}

TEST(BFloat16, CastConvertsBothWaysAndReturnsTheSameTensorForItsOwnType) {
  const Tensor x = mul(randn({5, 7}, 1), 100.0);  // float32
  const Tensor h = cast(x, DType::kBFloat16);
  ASSERT_EQ(h.dtype(), DType::kBFloat16);
  EXPECT_EQ(h.shape(), x.shape());
  const std::vector<float> xv = x.to_vector<float>();
  const std::vector<bf16> hv = h.to_vector<bf16>();
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(hv[i], bf16::from_float(xv[i])) << i;
  const std::vector<float> back = cast(h, DType::kFloat32).to_vector<float>();
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(back[i], hv[i].to_float());
  EXPECT_TRUE(cast(x, DType::kFloat32).is_same(x));
  EXPECT_EQ(cast(cast(x, DType::kFloat64), DType::kBFloat16).to_vector<bf16>(), hv);
  EXPECT_EQ(cast(from_vector(std::vector<float>{2.5f}, {1}), DType::kBFloat16).item(), 2.5);
}

TEST(BFloat16, CreationFunctionsRoundTheirFloat32Values) {
  const Tensor r = randn({100}, 7, {DType::kBFloat16});
  const std::vector<float> ref = randn({100}, 7).to_vector<float>();
  const std::vector<bf16> rv = r.to_vector<bf16>();
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(rv[i], bf16::from_float(ref[i]));
  EXPECT_EQ(ones({3}, {DType::kBFloat16}).to_vector<bf16>(),
            std::vector<bf16>(3, bf16::from_float(1.0f)));
  EXPECT_EQ(zeros({2}, {DType::kBFloat16}).to_vector<bf16>(), std::vector<bf16>(2, bf16{}));
}

TEST(BFloat16, TheGradientOfACastIsCastBack) {
  const Tensor x = randn({4, 3}, 2, f64()).set_requires_grad(true);
  const Tensor w = randn({4, 3}, 3, f64());
  // x -> bfloat16 -> float64, times w, summed: dL/dx = w passed back through bfloat16.
  backward(sum(mul(cast(cast(x, DType::kBFloat16), DType::kFloat64), w)));
  ASSERT_EQ(x.grad().dtype(), DType::kFloat64);
  const std::vector<double> g = values(x.grad()), wv = values(w);
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i], static_cast<double>(bf16::from_float(static_cast<float>(wv[i])).to_float()));
  }
  // Accumulating into a bfloat16 gradient: the sum in float32, rounded.
  Tensor acc = cast(full({2}, 1.0), DType::kBFloat16);
  cast_backward(full({2}, 0x1p-9), DType::kBFloat16, {&acc, true});
  EXPECT_EQ(acc.to_vector<bf16>(), std::vector<bf16>(2, bf16::from_float(1.0f + 0x1p-9f)));
}

TEST(BFloat16, EveryOpTakesItOnTheCpuBackendAndTheOptimizersThroughMasters) {
  const Tensor h = cast(randn({2, 3}, 4), DType::kBFloat16);
  // Every op computes in bfloat16 on the CPU too (Note [bfloat16 on the CPU]); a sum or loss is
  // float32.
  EXPECT_EQ(relu(h).dtype(), DType::kBFloat16);
  EXPECT_EQ(add(h, h).dtype(), DType::kBFloat16);
  EXPECT_EQ(linear(h, h).dtype(), DType::kBFloat16);
  EXPECT_EQ(sum(h).dtype(), DType::kFloat32);
  EXPECT_EQ(matmul(h, transpose(h, 0, 1)).dtype(), DType::kBFloat16);
  EXPECT_EQ(layer_norm(h, cast(ones({3}), DType::kBFloat16), Tensor()).dtype(), DType::kBFloat16);
  const Tensor image = cast(randn({1, 1, 4, 4}, 6), DType::kBFloat16);
  EXPECT_EQ(conv2d(image, cast(randn({1, 1, 3, 3}, 7), DType::kBFloat16)).dtype(),
            DType::kBFloat16);
  EXPECT_EQ(max_pool2d(image).dtype(), DType::kBFloat16);
  // ... and refuses what is not floating point, naming the dtype.
  GW_EXPECT_ERROR(conv2d(cast(image, DType::kFloat32), zeros({1, 1, 3, 3}, {DType::kInt32})),
                  "conv2d", "int32");
  GW_EXPECT_ERROR(cast(from_vector(std::vector<std::int32_t>{1, 2}, {2}), DType::kFloat32), "cast",
                  "int32", "floating-point");
  // The optimizers take bfloat16 parameters through float32 masters (Note [Master weights]).
  const Tensor p = cast(randn({3}, 5), DType::kBFloat16).detach().set_requires_grad(true);
  EXPECT_EQ(Sgd({p}).master(0).dtype(), DType::kFloat32);
}

}  // namespace
}  // namespace graphward
