// Fused attention on CUDA (Note [Fused attention], engine/runtime/dnn.h): bfloat16 q, k, v take cuDNN's
// SDPA where the build has it, forward and backward within bfloat16's tolerance of the composed
// float32 path on the CPU, causal and not, over several shapes; the shapes cuDNN refuses and
// float32 take the composed path and say so; the fused dropout drops each weight or scales it by
// 1/(1 − p), as often as p says, the backward through the same mask, a new mask each draw and the
// same for a generator of the same seed; a replayed backward through the fused op, dropout or not,
// equals the eager one bitwise.
#include <algorithm>

#include "graphward/capture/backward_graph.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
using testing::values;

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
  EXPECT_EQ(dropped.fused, kBuiltFused) << dropped.reason;  // dropout is fused too
  const AttentionPath cpu = attention_path(q16.to(Device::cpu()), q16.to(Device::cpu()),
                                           q16.to(Device::cpu()));
  EXPECT_FALSE(cpu.fused);
  EXPECT_NE(cpu.reason.find("CPU"), std::string::npos) << cpu.reason;
  if (!kBuiltFused) {
    const AttentionPath none = attention_path(q16, q16, q16);
    EXPECT_NE(none.reason.find("without cudnn-frontend"), std::string::npos) << none.reason;
  }
}

// With v the identity, the output is the dropped attention weights themselves: each weight of a
// draw is 0 or the undropped weight · 1/(1 − p), about p of them 0; a second draw drops others; a
// generator of the same seed draws the same. The gradients then equal the composed float32 path's
// with that mask as a fixed factor: the backward dropped what the forward did.
TEST_F(CudaAttention, FusedDropoutDropsAsTheGeneratorSaysAndTheBackwardUsesTheSameMask) {
  if (!kBuiltFused) GTEST_SKIP() << "built without cudnn-frontend: no fused path to test";
  constexpr std::int64_t kN = 4, kT = 64;
  constexpr double kP = 0.25;
  std::vector<float> eye(kN * kT * kT, 0.f);
  for (std::int64_t b = 0; b < kN; ++b) {
    for (std::int64_t i = 0; i < kT; ++i) eye[(b * kT + i) * kT + i] = 1.f;
  }
  const Tensor q32 = randn({kN, kT, kT}, 61), k32 = randn({kN, kT, kT}, 62);
  const Tensor v32 = from_vector(eye, {kN, kT, kT});
  const Tensor dy32 = randn({kN, kT, kT}, 63);
  auto bf = [](const Tensor& t) { return cast(t, DType::kBFloat16).to(kGpu); };
  for (bool causal : {false, true}) {
    const Tensor q = bf(q32), k = bf(k32), v = bf(v32);
    const std::vector<double> weights =
        values(scaled_dot_product_attention(q, k, v, {.causal = causal}));
    Generator gen(kGpu, 7), again(kGpu, 7);
    const AttentionOptions dropping{.causal = causal, .dropout = kP, .generator = &gen};
    ASSERT_TRUE(attention_path(q, k, v, dropping).fused)
        << attention_path(q, k, v, dropping).reason;
    const std::vector<double> first = values(scaled_dot_product_attention(q, k, v, dropping));
    const std::vector<double> second = values(scaled_dot_product_attention(q, k, v, dropping));
    const std::vector<double> same = values(scaled_dot_product_attention(
        q, k, v, {.causal = causal, .dropout = kP, .generator = &again}));
    EXPECT_EQ(first, same) << "causal=" << causal << ": a generator of the same seed";
    // A kept weight is w/(1-p) to bfloat16 rounding: each side rounds its probabilities to
    // bfloat16 before the product with v and its output after it, so the two are up to four
    // roundings apart, each at most half a unit in the last place, 2^-8 of the value (1.6% in
    // all); a weight kept where it was dropped, or dropped with the wrong scale, is 0 or
    // 1/(1-p) = 1.33 times off.
    constexpr double kRounding = 4.0 / 256;
    std::int64_t live = 0, dropped = 0, differ = 0, wrong = 0, masked = 0;
    double worst = 0;
    std::vector<float> mask(first.size());
    for (std::size_t e = 0; e < first.size(); ++e) {
      const std::int64_t i = (e / kT) % kT, j = e % kT;
      if (causal && j > i) {
        masked += first[e] != 0;
        continue;
      }
      ++live;
      const double kept = weights[e] / (1 - kP);
      if (first[e] == 0) {
        ++dropped;
      } else {
        const double off = std::abs(first[e] - kept) / kept;
        worst = std::max(worst, off);
        wrong += off > kRounding;
        mask[e] = static_cast<float>(1 / (1 - kP));
      }
      differ += (first[e] == 0) != (second[e] == 0);
    }
    EXPECT_EQ(masked, 0) << "causal=" << causal << ": weights past the causal mask";
    EXPECT_EQ(wrong, 0) << "causal=" << causal << ": weights neither 0 nor w/(1-p); the worst "
                        << worst << " off";
    EXPECT_NEAR(static_cast<double>(dropped) / live, kP, 0.02) << "causal=" << causal;
    EXPECT_GT(differ, live / 4) << "causal=" << causal << ": the second draw's mask";

    // The backward: fused, from a generator of the same seed (the first draw's mask again),
    // against the float32 composed path with that mask.
    Generator third(kGpu, 7);
    const Tensor qg = bf(q32).detach().set_requires_grad(true);
    const Tensor kg = bf(k32).detach().set_requires_grad(true);
    const Tensor vg = bf(v32).detach().set_requires_grad(true);
    const Tensor out = scaled_dot_product_attention(
        qg, kg, vg, {.causal = causal, .dropout = kP, .generator = &third});
    EXPECT_EQ(values(out), first);
    backward({out}, {bf(dy32)});
    const Tensor qr = q32.detach().set_requires_grad(true);
    const Tensor kr = k32.detach().set_requires_grad(true);
    const Tensor vr = v32.detach().set_requires_grad(true);
    const Tensor scores = bmm(qr, kr, false, true, 1.0 / std::sqrt(double(kT)));
    const Tensor w = causal ? causal_softmax(scores) : softmax(scores);
    const Tensor ref = bmm(mul(w, from_vector(mask, {kN, kT, kT})), vr);
    backward({ref}, {dy32});
    const Tensor* got[] = {&qg, &kg, &vg};
    const Tensor* want[] = {&qr, &kr, &vr};
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(error_against_float32(got[i]->grad(), want[i]->grad()), 2e-2)
          << "causal=" << causal << ", grad of input " << i;
    }
  }
}

// q, k, v = x + a parameter each; the loss Σ attention(q, k, v) ⊙ c (c fixed, so that the
// gradients are not symmetric). 10 steps of fresh x through a static input: one capture, the
// replayed gradients bitwise equal to the eager backward's; the fused op (where built) in both;
// without dropout and with it (each side its generator of one seed: a new mask every step, the
// same on both sides).
TEST_F(CudaAttention, AReplayedBackwardThroughFusedAttentionEqualsTheEagerOneBitwise) {
  for (double p : {0.0, 0.1}) {
    SCOPED_TRACE(p);
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
    Generator graphed_gen(kGpu, 11), eager_gen(kGpu, 11);
    auto loss = [&](const Params& w, const Tensor& x, Generator& gen) {
      const Tensor out = scaled_dot_product_attention(
          add(x, w.q), add(x, w.k), add(x, w.v),
          {.causal = true, .dropout = p, .generator = p > 0 ? &gen : nullptr});
      return sum(mul(out, c));
    };
    auto grads = [](const Params& w) {
      return std::vector<std::vector<float>>{cast(w.q.grad(), DType::kFloat32).to_vector<float>(),
                                             cast(w.k.grad(), DType::kFloat32).to_vector<float>(),
                                             cast(w.v.grad(), DType::kFloat32).to_vector<float>()};
    };
    const Tensor x = zeros(shape, {DType::kBFloat16, kGpu});
    ASSERT_NO_FATAL_FAILURE(testing::expect_replayed_grads_equal_eager(
        kGpu, 10,
        [&](int s) {
          copy_(x, cast(randn(shape, 100 + s, {DType::kFloat32, kGpu}), DType::kBFloat16));
        },
        [&](bool g) { return g ? loss(graphed, x, graphed_gen) : loss(eager, x, eager_gen); },
        [&](bool g) { return grads(g ? graphed : eager); }));
  }
}

// self_attention of bfloat16 qkv takes the fused path with q, k and v read in place (where built):
// its output and qkv's gradient within bfloat16's tolerance of the composed float32 path on the
// CPU, causal and not, over several shapes — an accumulated gradient too (qkv used twice), and a
// head of 12, which cuDNN refuses: composed (split_heads, the attention, the heads merged), saying
// so, and right.
TEST_F(CudaAttention, SelfAttentionReadsQkvInPlaceAndMatchesTheComposedFloat32Reference) {
  struct Case {
    std::int64_t batch, seq, heads, head;
    bool fused;
  };
  for (const Case& c : {Case{2, 64, 4, 32, true}, Case{3, 40, 2, 64, true},
                        Case{1, 128, 16, 16, true}, Case{2, 16, 2, 12, false}}) {
    const std::int64_t dim = c.heads * c.head, rows = c.batch * c.seq;
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " seq " << c.seq << " heads "
                                      << c.heads << " head " << c.head << " causal " << causal);
      const Tensor x = cast(randn({rows, 3 * dim}, 81), DType::kBFloat16);
      const Tensor dy = cast(randn({rows, dim}, 82), DType::kBFloat16);
      const Tensor extra = cast(randn({rows, 3 * dim}, 83), DType::kBFloat16);
      const AttentionPath path = self_attention_path(x.to(kGpu), c.seq, c.heads, {.causal = causal});
      EXPECT_EQ(path.fused, kBuiltFused && c.fused) << path.reason;
      if (!c.fused && kBuiltFused) {
        EXPECT_NE(path.reason.find("cuDNN refuses the shape"), std::string::npos) << path.reason;
      }
      // loss = Σ self_attention(qkv) ⊙ dy + Σ qkv ⊙ extra: qkv's gradient accumulates two.
      auto run = [&](DType dtype, Device device) {
        auto to = [&](const Tensor& t) {
          return (dtype == DType::kFloat32 ? cast(t, DType::kFloat32) : t).to(device);
        };
        const Tensor qkv = to(x).detach().set_requires_grad(true);
        const Tensor out = self_attention(qkv, c.seq, c.heads, {.causal = causal});
        backward({out, qkv}, {to(dy), to(extra)});
        return std::vector<Tensor>{out, qkv.grad()};
      };
      const std::vector<Tensor> ref = run(DType::kFloat32, Device::cpu());
      const std::vector<Tensor> got = run(DType::kBFloat16, kGpu);
      EXPECT_EQ(got[0].shape(), Shape({rows, dim}));
      EXPECT_EQ(got[1].dtype(), DType::kBFloat16);
      EXPECT_LT(error_against_float32(got[0], ref[0]), 2e-2) << "output; " << path.reason;
      EXPECT_LT(error_against_float32(got[1], ref[1]), 2e-2) << "grad qkv; " << path.reason;
      // Without the second use, the attention's own gradient against the reference's.
      const Tensor qkv = x.to(kGpu).detach().set_requires_grad(true);
      backward({self_attention(qkv, c.seq, c.heads, {.causal = causal})}, {dy.to(kGpu)});
      const Tensor q32 = cast(x, DType::kFloat32).detach().set_requires_grad(true);
      backward({self_attention(q32, c.seq, c.heads, {.causal = causal})},
               {cast(dy, DType::kFloat32)});
      EXPECT_LT(error_against_float32(qkv.grad(), q32.grad()), 2e-2) << "grad qkv alone";
    }
  }
}

// A transformer block's attention as the examples write it — qkv = linear(x) with a parameter,
// self_attention, a projection — under a BackwardGraph: 10 steps of fresh x, one capture, the
// replayed gradients bitwise the eager ones; with dropout too (each side its generator of one
// seed).
TEST_F(CudaAttention, AReplayedBackwardThroughSelfAttentionEqualsTheEagerOneBitwise) {
  for (double p : {0.0, 0.1}) {
    SCOPED_TRACE(p);
    const std::int64_t batch = 2, seq = 64, heads = 4, dim = 128;
    auto param = [&](const Shape& shape, std::uint64_t seed) {
      return cast(mul(randn(shape, seed, {DType::kFloat32, kGpu}), 0.1), DType::kBFloat16)
          .detach()
          .set_requires_grad(true);
    };
    struct Params {
      Tensor w, wo;
    };
    const Params graphed{param({3 * dim, dim}, 1), param({dim, dim}, 2)},
        eager{param({3 * dim, dim}, 1), param({dim, dim}, 2)};
    Generator graphed_gen(kGpu, 11), eager_gen(kGpu, 11);
    auto loss = [&](const Params& w, const Tensor& x, Generator& gen) {
      const Tensor o = self_attention(linear(x, w.w), seq, heads,
                                      {.causal = true, .dropout = p,
                                       .generator = p > 0 ? &gen : nullptr});
      return sum(linear(o, w.wo));
    };
    auto grads = [](const Params& w) {
      return std::vector<std::vector<float>>{cast(w.w.grad(), DType::kFloat32).to_vector<float>(),
                                             cast(w.wo.grad(), DType::kFloat32).to_vector<float>()};
    };
    const Tensor x = zeros({batch * seq, dim}, {DType::kBFloat16, kGpu});
    ASSERT_NO_FATAL_FAILURE(testing::expect_replayed_grads_equal_eager(
        kGpu, 10,
        [&](int s) {
          copy_(x, cast(randn({batch * seq, dim}, 100 + s, {DType::kFloat32, kGpu}),
                        DType::kBFloat16));
        },
        [&](bool g) { return g ? loss(graphed, x, graphed_gen) : loss(eager, x, eager_gen); },
        [&](bool g) { return grads(g ? graphed : eager); }));
  }
}

}  // namespace
}  // namespace graphward
