// Note [TF32]: the two switches (matmul, conv) change what float32 GEMMs and convolutions compute —
// within TF32's error of the float32 result, and measurably different from it — and switching
// back gives the float32 bits again; a captured backward or whole step never replays across a
// switch (captured anew, with the reason), and the replays after it equal the eager steps
// bitwise under the new setting.
#include <string>
#include <vector>

#include "graphward/capture/step_graph.h"
#include "graphward/engine/runtime/dnn.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

// Sets the switches for a test and restores them at its end, failed or not.
class Tf32Guard {
 public:
  Tf32Guard() : matmul_(matmul_tf32()), conv_(conv_tf32()) {}
  ~Tf32Guard() {
    set_matmul_tf32(matmul_);
    set_conv_tf32(conv_);
  }
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool matmul_, conv_;
};

class CudaTf32 : public testing::PoisonedCudaTest {
 protected:
  Tf32Guard guard_;
};

// TF32 keeps 10 of float32's 23 mantissa bits: a product of sums over k = 256 of unit normals
// lands about 1e-3 from the float32 result (relative, in norm); float32 algorithms differ by
// about 1e-7.
constexpr double kTf32Tol = 5e-3;
constexpr double kTf32Shows = 1e-5;

Tensor param(const Shape& shape, std::uint64_t seed) {
  return randn(shape, seed, kF32Gpu).detach().set_requires_grad(true);
}

struct Results {
  std::vector<Tensor> values;  // outputs, then gradients
};

// A linear layer, a bmm and a matmul with their gradients.
Results gemms(const Tensor& x, const Tensor& w, const Tensor& a, const Tensor& b) {
  x.grad() = Tensor();
  w.grad() = Tensor();
  const Tensor y = linear(x, w);
  const Tensor z = bmm(a, b);
  const Tensor m = matmul(y.detach(), w.detach());  // [128, 192] · [192, 256]
  backward(add(sum(y), sum(mul(y, y))));
  return {{y.detach().clone(), z.clone(), m.clone(), x.grad().clone(), w.grad().clone()}};
}

TEST_F(CudaTf32, TheMatmulSwitchChangesFloat32GemmsWithinTf32ErrorAndBackGivesTheFloat32Bits) {
  ASSERT_FALSE(matmul_tf32()) << "TF32 for matmul is off by default";
  ASSERT_FALSE(conv_tf32()) << "TF32 for conv is off by default";
  const Tensor x = param({128, 256}, 1), w = param({192, 256}, 2);
  const Tensor a = randn({4, 64, 256}, 3, kF32Gpu), b = randn({4, 256, 96}, 4, kF32Gpu);
  const Results fp32 = gemms(x, w, a, b);
  set_matmul_tf32(true);
  const Results tf32 = gemms(x, w, a, b);
  set_matmul_tf32(false);
  const Results again = gemms(x, w, a, b);
  const char* what[] = {"linear", "bmm", "matmul", "linear's input gradient",
                        "linear's weight gradient"};
  for (std::size_t i = 0; i < fp32.values.size(); ++i) {
    const double err = rel_error(tf32.values[i], fp32.values[i]);
    EXPECT_LT(err, kTf32Tol) << what[i];
    EXPECT_GT(err, kTf32Shows) << what[i] << ": TF32 on computed what float32 computes";
    EXPECT_EQ(again.values[i].to_vector<float>(), fp32.values[i].to_vector<float>())
        << what[i] << ": switched off again, the float32 plan's bits";
  }
  bool listed = false;
  for (const auto& c : debug::gemm_choices(kGpu)) {
    if (c.m == 128 && c.n == 192 && c.k == 256 && c.kind == "gemm" && c.tf32) listed = true;
    EXPECT_FALSE(c.bf16 && c.tf32) << "a bfloat16 GEMM never asks for TF32";
  }
  EXPECT_TRUE(listed) << "debug::gemm_choices lists the linear's TF32 plan as tf32";
}

#if GRAPHWARD_HAS_CUDNN
TEST_F(CudaTf32, TheConvSwitchChangesFloat32ConvolutionsWithinTf32ErrorAndBackGivesTheFloat32Bits) {
  const Tensor x = param({16, 64, 32, 32}, 5), w = param({64, 64, 3, 3}, 6);
  auto run = [&] {
    x.grad() = Tensor();
    w.grad() = Tensor();
    const Tensor y = conv2d(x, w, Tensor(), {.padding = 1});
    backward(sum(mul(y, y)));
    return std::vector<Tensor>{y.detach().clone(), x.grad().clone(), w.grad().clone()};
  };
  const std::vector<Tensor> fp32 = run();
  set_conv_tf32(true);
  const std::vector<Tensor> tf32 = run();
  const kernels::ConvGeom g{16, 64, 32, 32, 64, 3, 3, /*pad=*/1, /*stride=*/1, true};
  const std::string plan = dnn::conv2d_plan_description(kGpu, g);
  set_conv_tf32(false);
  const std::vector<Tensor> again = run();
  // The switch reaches cuDNN: with TF32 allowed it offers TF32 algorithms. Which one runs is the
  // timing's choice (or the heuristic's, GRAPHWARD_CUDNN_FIND=0): a float32 one can time fastest,
  // as it did under a sanitizer's instrumentation, so the choice itself is not asserted here.
  const std::string count_label = "TF32 candidates ";
  const std::size_t at = plan.rfind(count_label);
  ASSERT_NE(at, std::string::npos) << plan;
  EXPECT_GT(std::stoi(plan.substr(at + count_label.size())), 0)
      << "a 64-channel 3x3 convolution with TF32 allowed was offered no TF32 algorithm: " << plan;
  const char* what[] = {"conv2d", "its input gradient", "its weight gradient"};
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_LT(rel_error(tf32[i], fp32[i]), kTf32Tol) << what[i] << "; " << plan;
    EXPECT_EQ(again[i].to_vector<float>(), fp32[i].to_vector<float>())
        << what[i] << ": switched off again, the float32 plan's bits";
  }
  const std::string fp32_plan = dnn::conv2d_plan_description(kGpu, g);
  EXPECT_EQ(fp32_plan.substr(0, fp32_plan.rfind("; TF32 candidates")).find("TF32"),
            std::string::npos)
      << "the float32 plan uses no TF32 algorithm: " << fp32_plan;
}
#endif

// A captured backward replays the kernels it chose: a switch between steps is a new capture
// (whose replays equal the eager backward under the new setting, bitwise), never a stale replay;
// switching back finds the first graph again.
TEST_F(CudaTf32, ABackwardGraphIsCapturedAnewAcrossASwitchNeverReplayedStale) {
  const Tensor x = zeros({64, 128}, kF32Gpu), t = zeros({64, 32}, kF32Gpu);
  const Tensor w1 = param({96, 128}, 7), w2 = param({32, 96}, 8);
  const Tensor e1 = w1.detach().clone().set_requires_grad(true),
               e2 = w2.detach().clone().set_requires_grad(true);
  auto loss = [&](const Tensor& a, const Tensor& b) { return mse_loss(linear(linear(x, a), b), t); };
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);
  std::uint64_t captures = 0;
  for (int s = 0; s < 12; ++s) {
    const bool on = (s / 4) % 2 == 1;  // 4 steps off, 4 on, 4 off
    set_matmul_tf32(on);
    {
      NoGradGuard no_grad;
      copy_(x, randn(x.shape(), 100 + s, kF32Gpu));
      copy_(t, randn(t.shape(), 200 + s, kF32Gpu));
    }
    {
      StepScope scope(arena);
      bw.backward(loss(w1, w2), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(loss(e1, e2), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(w1.grad().to_vector<float>(), e1.grad().to_vector<float>())
        << "step " << s << " (TF32 " << (on ? "on" : "off") << "); " << bw.stats().reason;
    ASSERT_EQ(w2.grad().to_vector<float>(), e2.grad().to_vector<float>()) << "step " << s;
    if (s == 4) {
      EXPECT_EQ(bw.stats().counters.captures, captures + 1)
          << "the switch was replayed over: " << bw.stats().reason;
      EXPECT_NE(bw.stats().reason.find("TF32"), std::string::npos) << bw.stats().reason;
    }
    captures = bw.stats().counters.captures;
  }
  // Off again at step 8: the first graph (cached for the setting) or a new capture, never the
  // TF32 one; the bits above say which kernels ran.
  EXPECT_GE(bw.stats().counters.replays, 8u);
}

// A captured whole step notes the switches: a switch is a new capture with the reason.
TEST_F(CudaTf32, AStepGraphIsCapturedAnewAcrossASwitchWithTheReason) {
  const Tensor x = zeros({64, 128}, kF32Gpu), t = zeros({64, 32}, kF32Gpu);
  std::vector<Tensor> graphed{param({96, 128}, 9), param({32, 96}, 10)};
  std::vector<Tensor> eager{graphed[0].detach().clone().set_requires_grad(true),
                            graphed[1].detach().clone().set_requires_grad(true)};
  AdamW opt_g(graphed, {.lr = 0.01}), opt_e(eager, {.lr = 0.01});
  StepGraph step(kGpu, {x, t});
  auto body = [&](std::vector<Tensor>& p, AdamW& opt) {
    opt.zero_grad();
    Tensor l = mse_loss(linear(linear(x, p[0]), p[1]), t);
    backward(l);
    opt.step();
    return l;
  };
  for (int s = 0; s < 10; ++s) {
    set_matmul_tf32(s >= 5);
    {
      NoGradGuard no_grad;
      copy_(x, randn(x.shape(), 300 + s, kF32Gpu));
      copy_(t, randn(t.shape(), 400 + s, kF32Gpu));
    }
    const std::uint64_t captures = step.counters().captures;
    step.run([&] { return body(graphed, opt_g); });
    body(eager, opt_e);
    for (std::size_t i = 0; i < graphed.size(); ++i) {
      ASSERT_EQ(graphed[i].to_vector<float>(), eager[i].to_vector<float>())
          << "step " << s << ", parameter " << i << "; " << step.last_reason();
    }
    if (s == 5) {
      EXPECT_EQ(step.counters().captures, captures + 1) << "the switch was replayed over";
      EXPECT_NE(step.last_reason().find("TF32"), std::string::npos) << step.last_reason();
    }
  }
  EXPECT_GE(step.counters().replays, 6u);
}

}  // namespace
}  // namespace graphward
