// bfloat16 on the CPU backend (Note [bfloat16 on the CPU], engine/ops/ops_common.h): every bfloat16 op
// within its tolerance of the float32 reference (tests/ops/bf16_cases.h), and its rounding
// emulated exactly: a bfloat16 op's outputs are the float32 op's on the widened inputs, each
// rounded once to nearest even; the loss of a bfloat16 cross-entropy is float32.
#include "ops/bf16_cases.h"
#include "test_util.h"

namespace graphward {
namespace {
const TensorOptions kBf16Cpu{DType::kBFloat16, Device::cpu()};

TEST(Bf16Cpu, EveryBf16OpIsWithinItsToleranceOfTheFloat32Reference) {
  testing::expect_bf16_cases_within_tolerance(kBf16Cpu);
}

TEST(Bf16Cpu, AnOpsOutputsAreTheFloat32OpsOnTheWidenedInputsRoundedOnce) {
  const Tensor xb = cast(mul(randn({8, 300}, 1), 4.0), DType::kBFloat16);
  const Tensor dyb = cast(randn({8, 300}, 2), DType::kBFloat16);
  const Tensor xw = cast(xb, DType::kFloat32), dyw = cast(dyb, DType::kFloat32);
  auto same = [](const Tensor& bf16_result, const Tensor& f32_result) {
    EXPECT_EQ(bf16_result.dtype(), DType::kBFloat16);
    const Tensor rounded = cast(f32_result, DType::kBFloat16);
    EXPECT_EQ(cast(bf16_result, DType::kFloat32).to_vector<float>(),
              cast(rounded, DType::kFloat32).to_vector<float>());
  };
  same(softmax(xb), softmax(xw));
  same(log_softmax(xb), log_softmax(xw));
  same(causal_softmax(reshape(xb, {2, 4, 300})), causal_softmax(reshape(xw, {2, 4, 300})));
  // A backward reads the saved output as stored: bfloat16 (rounded) there.
  const Tensor yb = softmax(xb);
  Tensor gb, gw;
  softmax_backward(dyb, yb, {&gb});
  softmax_backward(dyw, cast(yb, DType::kFloat32), {&gw});
  same(gb, gw);
  // Accumulating: the float32 sum of the stored bfloat16 and the new value, rounded once.
  softmax_backward(dyb, yb, {&gb, /*accumulate=*/true});
  Tensor acc = cast(gw, DType::kBFloat16);
  Tensor sum = add(cast(acc, DType::kFloat32), gw);
  same(gb, sum);
}

TEST(Bf16Cpu, CrossEntropyOfBf16LogitsIsAFloat32LossWithABf16Gradient) {
  const Tensor x = cast(randn({4, 6}, 3), DType::kBFloat16).set_requires_grad(true);
  const Tensor loss = cross_entropy(x, from_vector(std::vector<std::int32_t>{0, 5, 2, 3}, {4}));
  EXPECT_EQ(loss.dtype(), DType::kFloat32);
  backward(loss);
  EXPECT_EQ(x.grad().dtype(), DType::kBFloat16);
  const Tensor xw = cast(x.detach(), DType::kFloat32).set_requires_grad(true);
  const Tensor lw = cross_entropy(xw, from_vector(std::vector<std::int32_t>{0, 5, 2, 3}, {4}));
  EXPECT_EQ(loss.item(), lw.item()) << "the loss is float32 math on the widened logits";
  backward(lw);
  EXPECT_EQ(cast(x.grad(), DType::kFloat32).to_vector<float>(),
            cast(cast(xw.grad(), DType::kBFloat16), DType::kFloat32).to_vector<float>());
}

}  // namespace
}  // namespace graphward
