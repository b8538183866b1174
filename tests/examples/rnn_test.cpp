// The LSTM example (examples/rnn.h) on the CPU backend: it converges, eagerly and with the graph
// modes (eager on the CPU) giving the same losses, with the fused cell, a layer an op and the
// composed cell alike; and as a GRU, fused and composed.
#include "examples/rnn.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

TEST(ExamplesCpu, TheStackedLstmConverges) {
  const ex::RnnConfig c{.in = 8, .hidden = 16, .out = 2, .batch = 16, .layers = 2,
                        .steps_in_time = 4, .lr = 1e-2};
  const ex::TrainResult eager = ex::train_rnn(c, Device::cpu(), ex::Mode::kEager, 60);
  EXPECT_LT(eager.last_loss, 0.5 * eager.first_loss) << eager.first_loss << " -> " << eager.last_loss;
  const ex::TrainResult graph = ex::train_rnn(c, Device::cpu(), ex::Mode::kBackwardGraph, 60);
  EXPECT_EQ(graph.last_loss, eager.last_loss);
  const ex::TrainResult step = ex::train_rnn(c, Device::cpu(), ex::Mode::kStepGraph, 60);
  EXPECT_EQ(step.first_loss, eager.first_loss);
  EXPECT_EQ(step.last_loss, eager.last_loss);
  ex::RnnConfig composed = c;
  composed.cell = ex::RnnCell::kComposed;
  const ex::TrainResult reference = ex::train_rnn(composed, Device::cpu(), ex::Mode::kEager, 60);
  EXPECT_NEAR(eager.first_loss, reference.first_loss, 1e-6 * reference.first_loss);
  EXPECT_NEAR(eager.last_loss, reference.last_loss, 1e-3 * reference.last_loss);
  ex::RnnConfig gru = c, gru_composed = c;
  gru.gru = gru_composed.gru = true;
  gru_composed.cell = ex::RnnCell::kComposed;
  const ex::TrainResult gru_fused = ex::train_rnn(gru, Device::cpu(), ex::Mode::kStepGraph, 60);
  const ex::TrainResult gru_ref = ex::train_rnn(gru_composed, Device::cpu(), ex::Mode::kEager, 60);
  EXPECT_LT(gru_ref.last_loss, 0.5 * gru_ref.first_loss);
  EXPECT_NEAR(gru_fused.first_loss, gru_ref.first_loss, 1e-6 * gru_ref.first_loss);
  EXPECT_NEAR(gru_fused.last_loss, gru_ref.last_loss, 1e-3 * gru_ref.last_loss);
  gru.cell = ex::RnnCell::kLayer;
  GW_EXPECT_ERROR(ex::RnnTrainer(gru, Device::cpu(), ex::Mode::kEager), "GRU has no layer op");
  ex::RnnConfig layered = c;
  layered.cell = ex::RnnCell::kLayer;
  for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kStepGraph}) {
    const ex::TrainResult by_layer = ex::train_rnn(layered, Device::cpu(), m, 60);
    EXPECT_NEAR(by_layer.first_loss, reference.first_loss, 1e-6 * reference.first_loss);
    EXPECT_NEAR(by_layer.last_loss, reference.last_loss, 1e-3 * reference.last_loss);
  }
}

}  // namespace
}  // namespace graphward
