// The convnet and transformer examples (examples/convnet.h, transformer.h) on the CPU backend:
// each converges, and its modes (the graph modes run eagerly on the CPU; the optimizer stepped
// inside the backward too) give the same losses.
#include "examples/convnet.h"
#include "examples/transformer.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

template <class Model>
void expect_converges_and_modes_agree(const typename Model::Config& c, int steps) {
  const ex::TrainResult eager = ex::train<Model>(c, Device::cpu(), ex::Mode::kEager, steps);
  EXPECT_LT(eager.last_loss, 0.25 * eager.first_loss) << eager.first_loss << " -> "
                                                      << eager.last_loss;
  for (ex::Mode m :
       {ex::Mode::kBackwardGraph, ex::Mode::kStepGraph, ex::Mode::kStepGraphInBackward}) {
    const ex::TrainResult r = ex::train<Model>(c, Device::cpu(), m, steps);
    EXPECT_EQ(r.first_loss, eager.first_loss) << ex::mode_name(m);
    EXPECT_EQ(r.last_loss, eager.last_loss) << ex::mode_name(m);
    EXPECT_EQ(r.captures, 0u);
  }
}

TEST(ExamplesCpu, TheConvnetConvergesAndItsModesAgree) {
  expect_converges_and_modes_agree<ex::ConvnetModel>(
      {.batch = 32, .channels = 2, .image = 8, .c1 = 4, .c2 = 8, .classes = 4, .batches = 2,
       .lr = 1e-2, .noise = 0.5},
      40);
}

TEST(ExamplesCpu, TheTransformerConvergesAndItsModesAgree) {
  expect_converges_and_modes_agree<ex::TransformerModel>(
      {.batch = 4, .seq = 8, .dim = 16, .heads = 2, .ff = 32, .vocab = 8, .batches = 2,
       .lr = 1e-2},
      60);
}

}  // namespace
}  // namespace graphward
