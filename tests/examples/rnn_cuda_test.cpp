// The LSTM example (examples/rnn.h) on the GPU: with its layers on streams of their own (the
// wavefront) it computes exactly what one stream computes — the same kernels, ordered by the
// tensors' streams alone — and it converges eagerly, with the backward captured (once) and with the
// whole step captured (once: the batches alternate through the graph's input slots) — with the
// fused cell, and, eagerly, with the composed one; and with a layer an op and as a GRU, the whole
// step captured.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "examples/rnn.h"
#include "json_check.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

TEST(ExamplesCuda, TheWavefrontLstmMatchesOneStreamAndConvergesCaptured) {
  GW_REQUIRE_GPU();
  // Small and short: the suite also runs under compute-sanitizer's racecheck, ~100x slower.
  ex::RnnConfig c{.in = 8, .hidden = 32, .out = 2, .batch = 16, .layers = 2, .steps_in_time = 3,
                  .lr = 1e-2};
  const Device gpu = Device::cuda(0);
  c.wavefront = true;
  const ex::TrainResult wave = ex::train_rnn(c, gpu, ex::Mode::kEager, 30);
  const ex::TrainResult wave_graph = ex::train_rnn(c, gpu, ex::Mode::kBackwardGraph, 30);
  const ex::TrainResult wave_step = ex::train_rnn(c, gpu, ex::Mode::kStepGraph, 30);
  c.wavefront = false;
  const ex::TrainResult one = ex::train_rnn(c, gpu, ex::Mode::kEager, 30);
  EXPECT_EQ(wave.first_loss, one.first_loss);
  EXPECT_EQ(wave.last_loss, one.last_loss);
  EXPECT_LT(wave.last_loss, 0.5 * wave.first_loss) << wave.first_loss << " -> " << wave.last_loss;
  EXPECT_LT(wave_graph.last_loss, 0.5 * wave_graph.first_loss);
  EXPECT_EQ(wave_graph.captures, 1u);
  EXPECT_NEAR(wave_graph.last_loss, wave.last_loss, 1e-3 * wave.last_loss + 1e-6);
  EXPECT_EQ(wave_step.first_loss, wave.first_loss);
  EXPECT_EQ(wave_step.captures, 1u);
  EXPECT_NEAR(wave_step.last_loss, wave.last_loss, 1e-3 * wave.last_loss + 1e-6);
  c.wavefront = true;
  c.cell = ex::RnnCell::kComposed;
  const ex::TrainResult composed = ex::train_rnn(c, gpu, ex::Mode::kEager, 30);
  EXPECT_NEAR(composed.first_loss, wave.first_loss, 1e-5 * wave.first_loss);
  EXPECT_NEAR(composed.last_loss, wave.last_loss, 1e-2 * wave.last_loss);
  c.cell = ex::RnnCell::kLayer;  // a layer an op, its whole step captured once
  const ex::TrainResult layered = ex::train_rnn(c, gpu, ex::Mode::kStepGraph, 30);
  EXPECT_EQ(layered.captures, 1u);
  EXPECT_NEAR(layered.first_loss, wave.first_loss, 1e-5 * wave.first_loss);
  EXPECT_NEAR(layered.last_loss, wave.last_loss, 1e-2 * wave.last_loss);
  c.cell = ex::RnnCell::kFused;  // a GRU of fused cells, the wavefront's whole step captured once
  c.gru = true;
  const ex::TrainResult gru = ex::train_rnn(c, gpu, ex::Mode::kStepGraph, 30);
  EXPECT_EQ(gru.captures, 1u);
  EXPECT_LT(gru.last_loss, 0.5 * gru.first_loss) << gru.first_loss << " -> " << gru.last_loss;
}

// The wavefront's backward, traced in one replay: every layer's cells on a stream of their own,
// and the file a Chrome trace.
TEST(ExamplesCuda, TheWavefrontsTracedBackwardRunsEachLayerOnItsStream) {
  GW_REQUIRE_GPU();
  const ex::RnnConfig c{.in = 8, .hidden = 32, .out = 2, .batch = 16, .layers = 3,
                        .steps_in_time = 3};
  ex::RnnTrainer trainer(c, Device::cuda(0), ex::Mode::kBackwardGraph);
  for (int i = 0; i < 3; ++i) (void)trainer.step(i);
  const std::string path = ::testing::TempDir() + "rnn_trace.json";
  const std::vector<StepTiming> steps = trainer.trace_backward(path);
  std::set<int> streams;
  for (const StepTiming& t : steps) streams.insert(t.stream);
  EXPECT_GE(streams.size(), static_cast<std::size_t>(c.layers)) << steps.size() << " steps";
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(testing::json_valid(text.str()));
}

}  // namespace
}  // namespace graphward
