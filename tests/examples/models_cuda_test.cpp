// The convnet and transformer examples on the GPU in their three modes: each converges; the graph
// modes capture once; the full-step graph's losses equal the eager ones — bitwise for the convnet
// (the same kernels in the same order; cuDNN's algorithms are chosen once per shape and
// deterministic), within rounding for the transformer (its embedding's gradient adds repeated ids
// with atomics, in an order that varies run to run) — and the backward graph's within rounding
// (its weight-gradient side streams). Under Autocast (bfloat16 matrix products) the causal
// transformer does the same, and ends within 2% of the float32 run's loss.
#include "examples/convnet.h"
#include "examples/transformer.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

template <class Model>
ex::TrainResult expect_every_mode_converges(const typename Model::Config& c, int steps,
                                            bool bitwise, bool autocast = false) {
  const Device gpu = Device::cuda(0);
  const ex::TrainResult eager = ex::train<Model>(c, gpu, ex::Mode::kEager, steps, autocast);
  const ex::TrainResult bw = ex::train<Model>(c, gpu, ex::Mode::kBackwardGraph, steps, autocast);
  const ex::TrainResult full = ex::train<Model>(c, gpu, ex::Mode::kStepGraph, steps, autocast);
  const ex::TrainResult in_bw =
      ex::train<Model>(c, gpu, ex::Mode::kStepGraphInBackward, steps, autocast);
  for (const ex::TrainResult* r : {&eager, &bw, &full, &in_bw}) {
    EXPECT_LT(r->last_loss, 0.25 * r->first_loss) << r->first_loss << " -> " << r->last_loss;
  }
  EXPECT_EQ(bw.captures, 1u);
  EXPECT_EQ(bw.updates, 0u);  // a new batch tensor every step: read through input slots
  EXPECT_EQ(full.captures, 1u);
  EXPECT_EQ(full.first_loss, eager.first_loss);  // nothing accumulated yet
  // The optimizer stepped inside the backward updates the parameters as opt.step() does.
  EXPECT_EQ(in_bw.captures, 1u);
  EXPECT_EQ(in_bw.first_loss, eager.first_loss);
  if (bitwise) {
    EXPECT_EQ(full.last_loss, eager.last_loss);
    EXPECT_EQ(in_bw.last_loss, eager.last_loss);
  } else {
    EXPECT_NEAR(full.last_loss, eager.last_loss, 1e-5 * eager.first_loss);
    EXPECT_NEAR(in_bw.last_loss, eager.last_loss, 1e-5 * eager.first_loss);
  }
  EXPECT_NEAR(bw.last_loss, eager.last_loss, 1e-3 * eager.first_loss);
  return eager;
}

// Small and short (the suite also runs under compute-sanitizer's racecheck, ~100x slower).
TEST(ExamplesCuda, TheConvnetConvergesInEveryModeAndTheGraphsCaptureOnce) {
  GW_REQUIRE_GPU();
  expect_every_mode_converges<ex::ConvnetModel>(
      {.batch = 32, .channels = 2, .image = 8, .c1 = 4, .c2 = 8, .classes = 4, .batches = 2,
       .lr = 1e-2, .noise = 0.5},
      25, /*bitwise=*/true);
}

// Channels last in bfloat16 (cuDNN's NHWC kernels, our NHWC bias, ReLU and pooling backward):
// every mode converges, the whole-step graph's losses bitwise the eager ones, and the run ends
// within 2% of the float32 run of the same model.
TEST(ExamplesCuda, AChannelsLastConvnetUnderAutocastConvergesInEveryModeBitwiseAndNearFloat32) {
  GW_REQUIRE_GPU();
  const ex::ConvnetConfig c{.batch = 32, .channels = 2, .image = 8, .c1 = 4, .c2 = 8,
                            .classes = 4, .batches = 2, .lr = 1e-2, .noise = 0.5,
                            .channels_last = true};
  const ex::TrainResult f32 = ex::train<ex::ConvnetModel>(c, Device::cuda(0), ex::Mode::kEager,
                                                          25);
  const ex::TrainResult b16 = expect_every_mode_converges<ex::ConvnetModel>(
      c, 25, /*bitwise=*/true, /*autocast=*/true);
  EXPECT_LE(b16.last_loss, 1.02 * f32.last_loss)
      << "bf16 " << b16.first_loss << " -> " << b16.last_loss << ", fp32 "
      << f32.first_loss << " -> " << f32.last_loss;
}

TEST(ExamplesCuda, TheTransformerConvergesInEveryModeAndTheGraphsCaptureOnce) {
  GW_REQUIRE_GPU();
  expect_every_mode_converges<ex::TransformerModel>(
      {.batch = 4, .seq = 8, .dim = 16, .heads = 2, .ff = 32, .vocab = 8, .batches = 2,
       .lr = 1e-2},
      35, /*bitwise=*/false);
}

TEST(ExamplesCuda, ACausalTransformerOfTwoBlocksConvergesInEveryModeAndTheGraphsCaptureOnce) {
  GW_REQUIRE_GPU();
  expect_every_mode_converges<ex::TransformerModel>({.batch = 4,
                                                     .seq = 8,
                                                     .dim = 16,
                                                     .heads = 2,
                                                     .ff = 32,
                                                     .vocab = 8,
                                                     .batches = 2,
                                                     .lr = 1e-2,
                                                     .blocks = 2,
                                                     .causal = true},
                                                    35, /*bitwise=*/false);
}

TEST(ExamplesCuda, ACausalTransformerUnderAutocastConvergesAndEndsWithin2PercentOfFloat32) {
  GW_REQUIRE_GPU();
  const ex::TransformerConfig c{.batch = 8, .seq = 16, .dim = 32, .heads = 2, .ff = 64,
                                .vocab = 8, .batches = 2, .lr = 1e-2, .blocks = 2,
                                .causal = true};
  const ex::TrainResult f32 = ex::train<ex::TransformerModel>(c, Device::cuda(0),
                                                              ex::Mode::kEager, 40);
  const ex::TrainResult b16 = expect_every_mode_converges<ex::TransformerModel>(
      c, 40, /*bitwise=*/false, /*autocast=*/true);
  EXPECT_NEAR(b16.first_loss, f32.first_loss, 0.02 * f32.first_loss);
  EXPECT_LE(b16.last_loss, 1.02 * f32.last_loss)
      << "bf16 " << b16.first_loss << " -> " << b16.last_loss << ", fp32 " << f32.first_loss
      << " -> " << f32.last_loss;
}

}  // namespace
}  // namespace graphward
