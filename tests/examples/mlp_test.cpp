// The MLP example (examples/mlp.h) on the CPU backend: it converges, and its modes (the graph
// modes run eagerly on the CPU; the optimizer stepped inside the backward too) give the same
// losses.
#include "examples/mlp.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

TEST(ExamplesCpu, TheMlpConvergesAndItsModesAgree) {
  const ex::MlpConfig c{.in = 16, .hidden = 32, .classes = 4, .batch = 64, .layers = 2, .batches = 2,
                        .lr = 1e-2};
  const ex::TrainResult eager = ex::train_mlp(c, Device::cpu(), ex::Mode::kEager, 60);
  EXPECT_LT(eager.last_loss, 0.25 * eager.first_loss) << eager.first_loss << " -> " << eager.last_loss;
  for (ex::Mode m :
       {ex::Mode::kBackwardGraph, ex::Mode::kStepGraph, ex::Mode::kStepGraphInBackward}) {
    const ex::TrainResult r = ex::train_mlp(c, Device::cpu(), m, 60);
    EXPECT_EQ(r.first_loss, eager.first_loss) << ex::mode_name(m);
    EXPECT_EQ(r.last_loss, eager.last_loss) << ex::mode_name(m);
    EXPECT_EQ(r.captures, 0u);
  }
}

}  // namespace
}  // namespace graphward
