// Fused attention on CUDA (Note [Fused attention], runtime/dnn.h): bfloat16 q, k, v take cuDNN's
// SDPA where the build has it, forward and backward within bfloat16's tolerance of the composed
// float32 path on the CPU, causal and not, over several shapes; the shapes cuDNN refuses, float32,
// and dropout take the composed path and say so; a replayed backward through the fused op equals
// the eager one bitwise.
#include "capture/backward_graph.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
constexpr bool kBuiltFused = GRAPHWARD_HAS_CUDNN_FRONTEND != 0;

class CudaAttention : public testing::PoisonedCudaTest {};

struct Shapes {
  Shape q, k, v;
};

// Output and q, k, v gradients of attention for dy, in `dtype` on `device`, from float32 inputs
// made on the CPU (the same values whatever the dtype, rounded to it).
std::vector<Tensor> attention_and_grads(const Shapes& s, bool causal, DType dtype, Device device) {
  auto input = [&](const Shape& shape, std::uint64_t seed) {
    Tensor t = randn(shape, seed);
    if (dtype != DType::kFloat32) t = cast(t, dtype);
    return t.to(device).detach().set_requires_grad(true);
  };
  const Tensor q = input(s.q, 1), k = input(s.k, 2), v = input(s.v, 3);
  Shape out_shape = s.q;
  out_shape.back() = s.v.back();
  Tensor dy = randn(out_shape, 4);
  if (dtype != DType::kFloat32) dy = cast(dy, dtype);
  const Tensor out = scaled_dot_product_attention(q, k, v, {.causal = causal});
  backward({out}, {dy.to(device)});
  return {out, q.grad(), k.grad(), v.grad()};
}

double error_against_float32(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(Device::cpu());
  return testing::rel_error(g.dtype() == DType::kFloat32 ? g : cast(g, DType::kFloat32), ref);
}

TEST_F(CudaAttention, Bf16TakesTheFusedPathAndMatchesTheComposedFloat32Reference) {
  const Shapes shapes[] = {
      {{4, 64, 64}, {4, 64, 64}, {4, 64, 64}},              // [batch·heads, T, d]
      {{2, 3, 128, 32}, {2, 3, 128, 32}, {2, 3, 128, 32}},  // [batch, heads, T, d]
      {{3, 40, 16}, {3, 72, 16}, {3, 72, 16}},              // fewer queries than keys
      {{2, 96, 128}, {2, 96, 128}, {2, 96, 128}}};          // a head of 128
  for (const Shapes& s : shapes) {
    for (bool causal : {false, true}) {
      const Tensor q = cast(randn(s.q, 1), DType::kBFloat16).to(kGpu);
      const Tensor k = cast(randn(s.k, 2), DType::kBFloat16).to(kGpu);
      const Tensor v = cast(randn(s.v, 3), DType::kBFloat16).to(kGpu);
      const AttentionPath path = attention_path(q, k, v, {.causal = causal});
      EXPECT_EQ(path.fused, kBuiltFused) << shape_str(s.q) << ": " << path.reason;
      const std::vector<Tensor> ref =
          attention_and_grads(s, causal, DType::kFloat32, Device::cpu());
      const std::vector<Tensor> got = attention_and_grads(s, causal, DType::kBFloat16, kGpu);
      const char* what[] = {"output", "grad q", "grad k", "grad v"};
      for (std::size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(got[i].dtype(), DType::kBFloat16);
        EXPECT_LT(error_against_float32(got[i], ref[i]), 2e-2)
            << shape_str(s.q) << " causal=" << causal << ", " << what[i] << "; " << path.reason;
      }
    }
  }
}

TEST_F(CudaAttention, WhatTheFusedPathCannotTakeIsComposedAndSaysWhy) {
  const Tensor q = cast(randn({2, 16, 12}, 1), DType::kBFloat16).to(kGpu);  // a head of 12
  const Tensor k = cast(randn({2, 16, 12}, 2), DType::kBFloat16).to(kGpu);
  const Tensor v = cast(randn({2, 16, 12}, 3), DType::kBFloat16).to(kGpu);
  const AttentionPath odd = attention_path(q, k, v);
  if (kBuiltFused) {
    EXPECT_FALSE(odd.fused) << odd.reason;
    EXPECT_NE(odd.reason.find("composed: cuDNN refuses the shape"), std::string::npos)
        << odd.reason;
  }
  const Shapes s{{2, 16, 12}, {2, 16, 12}, {2, 16, 12}};
  for (bool causal : {false, true}) {  // composed, and right
    const std::vector<Tensor> ref = attention_and_grads(s, causal, DType::kFloat32, Device::cpu());
    const std::vector<Tensor> got = attention_and_grads(s, causal, DType::kBFloat16, kGpu);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_LT(error_against_float32(got[i], ref[i]), 2e-2) << "causal=" << causal << ", " << i;
    }
  }
  const Tensor q32 = randn({2, 16, 16}, 4, {DType::kFloat32, kGpu});
  const AttentionPath f32 = attention_path(q32, q32, q32);
  EXPECT_FALSE(f32.fused);
  EXPECT_NE(f32.reason.find("float32"), std::string::npos) << f32.reason;
  const Tensor q16 = cast(q32, DType::kBFloat16);
  Generator gen(kGpu, 5);
  const AttentionPath dropped = attention_path(q16, q16, q16, {.dropout = 0.1, .generator = &gen});
  EXPECT_FALSE(dropped.fused);
  EXPECT_NE(dropped.reason.find("dropout"), std::string::npos) << dropped.reason;
  const AttentionPath cpu = attention_path(q16.to(Device::cpu()), q16.to(Device::cpu()),
                                           q16.to(Device::cpu()));
  EXPECT_FALSE(cpu.fused);
  EXPECT_NE(cpu.reason.find("CPU"), std::string::npos) << cpu.reason;
  if (!kBuiltFused) {
    const AttentionPath none = attention_path(q16, q16, q16);
    EXPECT_NE(none.reason.find("without cudnn-frontend"), std::string::npos) << none.reason;
  }
}

// q, k, v = x + a parameter each; the loss Σ attention(q, k, v) ⊙ c (c fixed, so that the
// gradients are not symmetric). 10 steps of fresh x through a static input: one capture, the
// replayed gradients bitwise equal to the eager backward's; the fused op (where built) in both.
TEST_F(CudaAttention, AReplayedBackwardThroughFusedAttentionEqualsTheEagerOneBitwise) {
  const Shape shape{2, 4, 64, 32};
  auto param = [&](std::uint64_t seed) {
    return cast(mul(randn(shape, seed, {DType::kFloat32, kGpu}), 0.5), DType::kBFloat16)
        .detach()
        .set_requires_grad(true);
  };
  const Tensor c = cast(randn({2, 4, 64, 32}, 9, {DType::kFloat32, kGpu}), DType::kBFloat16);
  struct Params {
    Tensor q, k, v;
  };
  const Params graphed{param(1), param(2), param(3)}, eager{param(1), param(2), param(3)};
  auto loss = [&](const Params& p, const Tensor& x) {
    const Tensor out =
        scaled_dot_product_attention(add(x, p.q), add(x, p.k), add(x, p.v), {.causal = true});
    return sum(mul(out, c));
  };
  auto grads = [](const Params& p) {
    return std::vector<std::vector<float>>{cast(p.q.grad(), DType::kFloat32).to_vector<float>(),
                                           cast(p.k.grad(), DType::kFloat32).to_vector<float>(),
                                           cast(p.v.grad(), DType::kFloat32).to_vector<float>()};
  };
  const Tensor x = zeros(shape, {DType::kBFloat16, kGpu});
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu);
  for (int s = 0; s < 10; ++s) {
    {
      NoGradGuard no_grad;
      copy_(x, cast(randn(shape, 100 + s, {DType::kFloat32, kGpu}), DType::kBFloat16));
    }
    {
      StepScope step(arena);
      bw.backward(loss(graphed, x), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(loss(eager, x), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(grads(graphed), grads(eager)) << "step " << s << "; " << bw.stats().reason;
  }
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, 9u);
}

}  // namespace
}  // namespace graphward
