// bfloat16 on CUDA: every bfloat16 op within its tolerance of the float32 CPU reference
// (tests/ops/bf16_cases.h); a bfloat16 kernel is its float32 kernel with bfloat16 loads and
// stores, so its outputs are the float32 op's on the widened inputs rounded once, bitwise.
#include "ops/bf16_cases.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
const TensorOptions kBf16Gpu{DType::kBFloat16, kGpu};

class CudaBf16 : public testing::PoisonedCudaTest {};

TEST_F(CudaBf16, EveryBf16OpIsWithinItsToleranceOfTheFloat32CpuReference) {
  testing::expect_bf16_cases_within_tolerance(kBf16Gpu);
}

TEST_F(CudaBf16, AKernelsOutputsAreItsFloat32KernelsOnTheWidenedInputsRoundedOnce) {
  for (std::int64_t cols : {40, 700, 3000}) {
    const Tensor xb = cast(mul(randn({8, cols}, 1, {DType::kFloat32, kGpu}), 4.0),
                           DType::kBFloat16);
    const Tensor dyb = cast(randn({8, cols}, 2, {DType::kFloat32, kGpu}), DType::kBFloat16);
    const Tensor xw = cast(xb, DType::kFloat32), dyw = cast(dyb, DType::kFloat32);
    auto same = [cols](const Tensor& bf16_result, const Tensor& f32_result, const char* what) {
      EXPECT_EQ(bf16_result.dtype(), DType::kBFloat16) << what;
      EXPECT_EQ(cast(bf16_result, DType::kFloat32).to_vector<float>(),
                cast(cast(f32_result, DType::kBFloat16), DType::kFloat32).to_vector<float>())
          << what << ", " << cols << " columns";
    };
    same(softmax(xb), softmax(xw), "softmax");
    same(log_softmax(xb), log_softmax(xw), "log_softmax");
    same(causal_softmax(reshape(xb, {2, 4, cols})), causal_softmax(reshape(xw, {2, 4, cols})),
         "causal_softmax");
    const Tensor yb = softmax(xb);
    Tensor gb, gw;
    softmax_backward(dyb, yb, {&gb});
    softmax_backward(dyw, cast(yb, DType::kFloat32), {&gw});
    same(gb, gw, "softmax_backward");
    const Tensor lb = log_softmax(xb);
    Tensor hb, hw;
    log_softmax_backward(dyb, lb, {&hb});
    log_softmax_backward(dyw, cast(lb, DType::kFloat32), {&hw});
    same(hb, hw, "log_softmax_backward");
  }
}

}  // namespace
}  // namespace graphward
