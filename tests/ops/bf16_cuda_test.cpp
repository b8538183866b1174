// bfloat16 on CUDA: every bfloat16 op within its tolerance of the float32 CPU reference
// (tests/ops/bf16_cases.h); a bfloat16 kernel is its float32 kernel with bfloat16 loads and
// stores, so its outputs are the float32 op's on the widened inputs rounded once, bitwise; a
// bfloat16 model's replayed backward equals its eager one bitwise.
#include "graphward/capture/backward_graph.h"
#include "ops/bf16_cases.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
const TensorOptions kBf16Gpu{DType::kBFloat16, kGpu};

class CudaBf16 : public testing::PoisonedCudaTest {};

// Autocast(parameters): the casts in one launch, the same bits as one cast a parameter.
TEST_F(CudaBf16, ParametersGivenUpFrontToAutocastAreCastAtOnceAsTheirFirstUsesWouldCastThem) {
  testing::expect_upfront_casts_as_lazy_ones(kGpu);
}

// A linear layer's float32 parameter gradients straight from cuBLASLt's bfloat16 GEMM (float32
// C and bias gradient), unrounded.
TEST_F(CudaBf16, ALinearLayersParameterGradientsAreFloat32FromItsBfloat16ProductsUnrounded) {
  testing::expect_linear_parameter_gradients_float32(kGpu);
}

// A layer norm's bfloat16 output under Autocast from the mixed kernels (float32 x, bfloat16 y and
// dy): bitwise the float32 kernels' with a cast.
TEST_F(CudaBf16, ALayerNormsOutputUnderAutocastIsTheFloat32OnesCastBitwiseAndSoIsItsBackward) {
  testing::expect_autocast_layer_norm_output_bf16(kGpu);
}

// A bfloat16 residual of float32 x widened in add_layer_norm's kernel (the block-a-row path's add
// its own kernel): bitwise a cast then the float32 add, one node.
TEST_F(CudaBf16, ABfloat16ResidualIsWidenedAsTheAddReadsItWithNoCastNode) {
  testing::expect_autocast_residual_widened_as_read(kGpu);
}

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
    // A layer norm's outputs and input gradient (its statistics float32 for both).
    const Tensor w = cast(add(mul(randn({cols}, 3, {DType::kFloat32, kGpu}), 0.1), 1.0),
                          DType::kBFloat16);
    const Tensor b = cast(randn({cols}, 4, {DType::kFloat32, kGpu}), DType::kBFloat16);
    same(layer_norm(xb, w, b), layer_norm(xw, cast(w, DType::kFloat32), cast(b, DType::kFloat32)),
         "layer_norm");
    const Tensor xl = xb.detach().set_requires_grad(true);
    const Tensor xlw = xw.detach().set_requires_grad(true);
    backward({layer_norm(xl, w, b)}, {dyb});
    backward({layer_norm(xlw, cast(w, DType::kFloat32), cast(b, DType::kFloat32))}, {dyw});
    same(xl.grad(), xlw.grad(), "layer_norm_backward");
  }
}

// A bfloat16 model — embedding, add_layer_norm,
// linear with GELU, linear, cross-entropy — trained 20 steps of fresh batches through static
// inputs: one capture, the replayed gradients bitwise equal to the eager backward's.
TEST_F(CudaBf16, ABf16ModelsReplayedGradientsEqualItsEagerOnes) {
  constexpr std::int64_t kVocab = 64, kDim = 48, kTokens = 32, kClasses = 10;
  auto param = [](const Shape& shape, std::uint64_t seed, double scale) {
    return cast(mul(randn(shape, seed, {DType::kFloat32, kGpu}), scale), DType::kBFloat16)
        .detach()
        .set_requires_grad(true);
  };
  struct Params {
    Tensor table, pos, ln_w, ln_b, w1, b1, w2;
  };
  auto make = [&] {
    return Params{param({kVocab, kDim}, 1, 1.0), param({kTokens, kDim}, 2, 0.5),
                  param({kDim}, 3, 0.1),         param({kDim}, 4, 0.1),
                  param({96, kDim}, 5, 0.2),     param({96}, 6, 0.1),
                  param({kClasses, 96}, 7, 0.2)};
  };
  auto loss = [](const Params& p, const Tensor& ids, const Tensor& targets) {
    const AddLayerNorm h = add_layer_norm(embedding(p.table, ids), p.pos, p.ln_w, p.ln_b);
    const Tensor z = linear(linear(h.normed, p.w1, p.b1, Activation::kGelu), p.w2);
    return cross_entropy(z, targets);
  };
  auto grads = [](const Params& p) {
    std::vector<std::vector<float>> out;
    for (const Tensor* t : {&p.table, &p.pos, &p.ln_w, &p.ln_b, &p.w1, &p.b1, &p.w2}) {
      out.push_back(cast(t->grad(), DType::kFloat32).to_vector<float>());
    }
    return out;
  };
  const Params graphed = make(), eager = make();
  const Tensor ids = zeros({kTokens}, {DType::kInt32, kGpu});
  const Tensor targets = zeros({kTokens}, {DType::kInt32, kGpu});
  testing::expect_replayed_grads_equal_eager(
      kGpu, 20,
      [&](int s) {
        std::vector<std::int32_t> id(kTokens), t(kTokens);
        for (std::int64_t i = 0; i < kTokens; ++i) {
          id[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((5 * s + 3 * i) % kVocab);
          t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((s + i * i) % kClasses);
        }
        copy_(ids, from_vector(id, {kTokens}, kGpu));
        copy_(targets, from_vector(t, {kTokens}, kGpu));
      },
      [&](bool g) { return loss(g ? graphed : eager, ids, targets); },
      [&](bool g) { return grads(g ? graphed : eager); });
}

}  // namespace
}  // namespace graphward
