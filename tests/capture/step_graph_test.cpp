// StepGraph on the CPU backend: every step runs eagerly (counted), bad construction is refused by
// name. The capture itself is tested on the GPU (step_graph_cuda_test.cpp).
#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {

TEST(StepGraphCpu, RunsEveryStepEagerlyOnTheCpu) {
  const Tensor x = randn({8, 4}, 1), t = randn({8, 3}, 2);
  const Tensor w = mul(randn({3, 4}, 3), 0.3).detach().set_requires_grad(true);
  Sgd opt({w}, {.lr = 0.1});
  StepGraph step(Device::cpu(), {x, t});
  int calls = 0;
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    const Tensor loss = step.run([&] {
      ++calls;
      const Tensor l = mse_loss(linear(x, w), t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      return l;
    });
    last = loss.item();
    if (s == 0) first = last;
  }
  EXPECT_EQ(calls, 30);
  EXPECT_EQ(step.counters().eager, 30u);
  EXPECT_EQ(step.counters().captures, 0u);
  EXPECT_LT(last, first);
}

TEST(StepGraphCpu, BadConstructionAndAnEmptyStepAreRefusedByName) {
  GW_EXPECT_ERROR(StepGraph(Device::cpu(), {Tensor()}), "StepGraph", "input 0", "undefined");
  StepGraph step(Device::cpu(), {});
  GW_EXPECT_ERROR(step.run({}), "StepGraph::run", "step function");
  // Nothing captured (the CPU runs every step eagerly): no graph to write.
  GW_EXPECT_ERROR(step.write_dot(::testing::TempDir() + "none.dot"), "StepGraph::write_dot",
                  "no graph has been captured");
}

TEST(StepGraphCpu, ABatchStepReadsTheBatchItselfOnTheCpuAndBadBatchesAreRefusedByName) {
  const Tensor w = mul(randn({3, 4}, 3), 0.3).detach().set_requires_grad(true);
  StepGraph step(Device::cpu());
  std::vector<const void*> seen;
  for (int s = 0; s < 3; ++s) {
    const std::vector<Tensor> batch = {randn({8, 4}, 10 + s), randn({8, 3}, 20 + s)};
    (void)step.run(batch, [&](const std::vector<Tensor>& in) {
      EXPECT_EQ(in.size(), 2u);
      seen.push_back(in[0].raw_data());
      const Tensor l = mse_loss(linear(in[0], w), in[1]);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      return l;
    });
    EXPECT_EQ(seen.back(), batch[0].raw_data());  // eager: the batch itself, no copy
  }
  EXPECT_EQ(step.counters().eager, 3u);
  auto any = [](const std::vector<Tensor>& in) { return in.at(0); };
  GW_EXPECT_ERROR((void)step.run({randn({2}, 1), Tensor()}, any), "StepGraph::run",
                  "batch tensor 1", "undefined");
  GW_EXPECT_ERROR((void)step.run({randn({2}, 1)}, StepGraph::BatchStep()), "StepGraph::run",
                  "step function");
  EXPECT_EQ(step.counters().eager, 3u);  // refused before anything ran
}

}  // namespace
}  // namespace graphward
