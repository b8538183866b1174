// Reliability on the GPU: a non-finite loss is refused before anything is written
// (Note [Non-finite loss], engine/backward/backward.h), and the localizing backward (Note [Kernel faults],
// base/error.h) gives the gradients of the plain one; nothing of a model outlives it (no
// thread-local keeps its tensors). The out-of-memory and fault tests run alone:
// faults/serial_cuda_test.cpp.
#include <limits>
#include <vector>

#include "graphward/capture/backward_graph.h"
#include "graphward/capture/signature.h"
#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

struct Model {
  Tensor w1 = mul(randn({64, 32}, 1, kF32Gpu), 0.2).detach().set_requires_grad(true);
  Tensor w2 = mul(randn({16, 64}, 2, kF32Gpu), 0.2).detach().set_requires_grad(true);
  Tensor loss(const Tensor& x, const Tensor& t) const {
    return mse_loss(linear(linear(x, w1, {}, Activation::kGelu), w2), t);
  }
};

Tensor with_one(const Tensor& x, float value) {  // x with its element 5 set to `value`
  std::vector<float> v = x.to_vector<float>();
  v[5] = value;
  return from_vector(v, x.shape(), x.device());
}

TEST(CudaNonFiniteLoss, ANanLossIsRefusedBeforeAnythingIsWrittenAndTheNextStepReplays) {
  GW_REQUIRE_GPU();
  const Tensor x = randn({32, 32}, 3, kF32Gpu), t = randn({32, 16}, 4, kF32Gpu);
  const Tensor x_nan = with_one(x, std::numeric_limits<float>::quiet_NaN());
  Model graphed, eager;
  BackwardGraph bw(kGpu, {.backward = {.check_finite_loss = true}});
  for (int step = 0; step < 3; ++step) bw.backward(graphed.loss(x, t));  // accumulates
  const auto counters = bw.stats().counters;
  ASSERT_EQ(counters.captures, 1u);
  const std::vector<float> g1 = graphed.w1.grad().to_vector<float>();
  const std::vector<float> g2 = graphed.w2.grad().to_vector<float>();
  GW_EXPECT_ERROR(bw.backward(graphed.loss(x_nan, t)), "BackwardGraph::backward",
                  "non-finite value", "nan", "expected a finite loss", "Nothing was written");
  EXPECT_EQ(graphed.w1.grad().to_vector<float>(), g1) << "a refused step wrote a .grad";
  EXPECT_EQ(graphed.w2.grad().to_vector<float>(), g2);
  EXPECT_EQ(bw.stats().counters.captures, counters.captures);
  EXPECT_EQ(bw.stats().counters.replays, counters.replays);
  // The next finite step replays the cached graph and accumulates as if the bad one never was.
  bw.backward(graphed.loss(x, t));
  EXPECT_EQ(bw.stats().counters.captures, counters.captures);
  EXPECT_EQ(bw.stats().counters.replays, counters.replays + 1);
  for (int step = 0; step < 4; ++step) backward(eager.loss(x, t));
  EXPECT_LT(testing::rel_error(graphed.w1.grad(), eager.w1.grad()), 1e-6);
  EXPECT_LT(testing::rel_error(graphed.w2.grad(), eager.w2.grad()), 1e-6);
}

TEST(CudaNonFiniteLoss, AnInfiniteLossIsRefusedByTheEagerBackwardAndTheCheckIsRefusedInACapture) {
  GW_REQUIRE_GPU();
  const Tensor x = randn({32, 32}, 3, kF32Gpu), t = randn({32, 16}, 4, kF32Gpu);
  Model m;
  const Tensor bad = m.loss(x, with_one(t, std::numeric_limits<float>::infinity()));
  GW_EXPECT_ERROR(backward(bad, {.check_finite_loss = true}), "backward: root 0", "inf",
                  "expected a finite loss");
  EXPECT_FALSE(m.w1.grad().defined()) << "a refused backward made a .grad";
  // The tape was left whole: the same loss may still be backpropagated without the check.
  backward(bad);
  EXPECT_TRUE(m.w1.grad().defined());
  // Inside a captured step the check cannot read the loss: refused by name.
  StepGraph step(kGpu, {x, t});
  auto body = [&] {
    const Tensor l = m.loss(x, t);
    backward(l, {.grad_write = GradWrite::kOverwrite, .check_finite_loss = true});
    return l;
  };
  (void)step.run(body);  // warm-up, eager: checked
  GW_EXPECT_ERROR((void)step.run(body), "finite-loss check", "capturing");
}

TEST(CudaLocalizeFaults, WithLocalizeFaultsEveryBackwardIsEagerAndGivesThePlainGradients) {
  GW_REQUIRE_GPU();
  const Tensor x = randn({32, 32}, 3, kF32Gpu), t = randn({32, 16}, 4, kF32Gpu);
  Model localized, plain;
  BackwardGraph bw(kGpu, {.backward = {.localize_faults = true}});
  for (int step = 0; step < 4; ++step) {
    bw.backward(localized.loss(x, t), GradWrite::kOverwrite);
    backward(plain.loss(x, t), {.grad_write = GradWrite::kOverwrite, .split_weight_grads = true});
  }
  EXPECT_EQ(bw.stats().counters.captures, 0u);
  EXPECT_EQ(bw.stats().eager_backwards, 4u);
  EXPECT_EQ(localized.w1.grad().to_vector<float>(), plain.w1.grad().to_vector<float>());
  EXPECT_EQ(localized.w2.grad().to_vector<float>(), plain.w2.grad().to_vector<float>());
}

// Once a model, its tensors, its BackwardGraph and StepGraph and its signatures are gone, so is
// every byte of theirs: nothing per thread (the tape log, the signature walker) keeps a parameter.
TEST(CudaMemory, NothingOfAModelOutlivesItsTensorsGraphsAndSignatures) {
  GW_REQUIRE_GPU();
  const std::uint64_t before = testing::pool_bytes_in_use();
  {
    const Tensor x = randn({32, 32}, 3, kF32Gpu), t = randn({32, 16}, 4, kF32Gpu);
    Model replayed, stepped, walked;
    {
      BackwardGraph bw(kGpu);
      for (int step = 0; step < 3; ++step) bw.backward(replayed.loss(x, t), GradWrite::kOverwrite);
      EXPECT_EQ(bw.stats().counters.captures, 1u);
    }
    {
      StepGraph step(kGpu, {x, t});
      Sgd opt({stepped.w1, stepped.w2}, {.lr = 0.01});
      for (int s = 0; s < 3; ++s) {
        (void)step.run([&] {
          const Tensor loss = stepped.loss(x, t);
          backward(loss, {.grad_write = GradWrite::kOverwrite});
          opt.step();
          return loss;
        });
      }
      EXPECT_EQ(step.counters().captures, 1u);
      EXPECT_EQ(step.counters().replays, 2u);
    }
    capture::TapeSignature sig;
    capture::tape_signature_walk(sig, {walked.loss(x, t)}, {}, current_stream(kGpu),
                                 GradWrite::kAccumulate);
    EXPECT_EQ(sig.leaves.size(), 2u);
  }
  EXPECT_EQ(testing::pool_bytes_in_use(), before) << "memory of a model outlived it";
}

}  // namespace
}  // namespace graphward
