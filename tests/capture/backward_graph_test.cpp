// BackwardGraph on the CPU backend: always the eager backward (graphs are a CUDA feature), same
// gradients as backward(), counted as eager; bad input refused by name.
#include "graphward/capture/backward_graph.h"
#include "graphward/engine/tape/tape_log.h"
#include "test_util.h"

namespace graphward {
namespace {

TEST(BackwardGraphCpu, RunsTheEagerBackwardAndCountsIt) {
  const Tensor w = randn({4, 3}, 1).set_requires_grad(true);
  const Tensor x = randn({5, 3}, 2), target = randn({5, 4}, 3);
  BackwardGraph bw(Device::cpu());
  for (int s = 0; s < 3; ++s) bw.backward(mse_loss(linear(x, w), target), GradWrite::kOverwrite);
  const std::vector<double> got = testing::values(w.grad());
  w.grad() = Tensor();
  backward(mse_loss(linear(x, w), target));
  EXPECT_EQ(got, testing::values(w.grad()));
  EXPECT_EQ(bw.stats().eager_backwards, 3u);
  EXPECT_EQ(bw.stats().counters.captures, 0u);
  EXPECT_EQ(bw.stats().counters.replays, 0u);
  EXPECT_EQ(bw.stats().reason, "");
  GW_EXPECT_ERROR(bw.write_dot("/tmp/none.dot"), "write_dot");
}

TEST(BackwardGraphCpu, BadLossesAreRefusedByName) {
  const Tensor w = randn({4}, 1).set_requires_grad(true);
  BackwardGraph bw(Device::cpu());
  GW_EXPECT_ERROR(bw.backward(mul(w, 2.0)), "BackwardGraph::backward", "one-element loss");
  GW_EXPECT_ERROR(bw.backward(sum(randn({4}, 2))), "requires grad");
  GW_EXPECT_ERROR(bw.backward(Tensor()), "one-element loss");
  GW_EXPECT_ERROR(BackwardGraph(Device::cpu(), {.cache_capacity = 0}), "capacity");
}

TEST(BackwardGraphCpu, OptionsThatDoNotApplyToAReplayAreRefusedByName) {
  std::vector<StepTiming> steps;
  GW_EXPECT_ERROR(BackwardGraph(Device::cpu(), {.backward = {.retain_graph = true}}),
                  "options.backward.retain_graph", "run the forward again");
  GW_EXPECT_ERROR(BackwardGraph(Device::cpu(), {.backward = {.timings = &steps}}),
                  "options.backward.timings", "BackwardGraph::trace()");
}

TEST(BackwardGraphCpu, BackwardOfALossWritesTheGradsAsTheOptionsSay) {
  const Tensor w = from_vector(std::vector<float>{1, 2}, {2}).set_requires_grad(true);
  BackwardGraph overwrite(Device::cpu(), {.backward = {.grad_write = GradWrite::kOverwrite}});
  for (int i = 0; i < 3; ++i) overwrite.backward(sum(mul(w, 3.0)));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3, 3})) << "accumulated";
  overwrite.backward(sum(mul(w, 3.0)), GradWrite::kAccumulate);  // the argument says otherwise
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{6, 6}));
  BackwardGraph accumulate(Device::cpu());  // the default: accumulate
  accumulate.backward(sum(mul(w, 3.0)));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{9, 9}));
}

// A BackwardGraph refused at construction (no destructor runs) leaves this thread's tape log as it
// was: an armed log would hold every later step's leaves on this thread until the thread ends.
TEST(BackwardGraphCpu, ARefusedConstructionLeavesTheTapeLogAsItWas) {
  const int armed = detail::tape_log().armed;
  GW_EXPECT_ERROR(BackwardGraph(Device::cuda(0), {.warmup = 0}), "BackwardGraph");
  EXPECT_EQ(detail::tape_log().armed, armed) << "the refused BackwardGraph left the log armed";
}

TEST(BackwardGraphCpu, TraceNamesWhatItNeedsAndLeavesTheTapeUsable) {
  // trace() times a replay of a CUDA graph: on the CPU backend it says so and where the eager
  // backward's timeline is; a bad loss is refused by name first. The tape is left as it was.
  const Tensor w = randn({4, 3}, 1).set_requires_grad(true);
  const Tensor x = randn({5, 3}, 2), target = randn({5, 4}, 3);
  BackwardGraph bw(Device::cpu());
  GW_EXPECT_ERROR((void)bw.trace(mul(w, 2.0)), "BackwardGraph::trace", "one-element loss");
  const Tensor loss = mse_loss(linear(x, w), target);
  GW_EXPECT_ERROR((void)bw.trace(loss), "BackwardGraph::trace: times a replay of a CUDA graph",
                  "backward(loss, {.timings = &steps})");
  EXPECT_TRUE(bw.trace_stream_names().empty());
  bw.backward(loss);  // the tape is intact
  EXPECT_TRUE(w.grad().defined());
  EXPECT_EQ(bw.stats().counters.captures, 0u);
}

}  // namespace
}  // namespace graphward
