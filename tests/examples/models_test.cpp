// The convnet and transformer examples (examples/convnet.h, transformer.h) on the CPU backend:
// each converges, and its modes (the graph modes run eagerly on the CPU; the optimizer stepped
// inside the backward too) give the same losses; under Autocast too, ending within 2% of float32.
#include "examples/convnet.h"
#include "examples/transformer.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

template <class Model>
ex::TrainResult expect_converges_and_modes_agree(const typename Model::Config& c, int steps,
                                                 bool autocast = false) {
  const ex::TrainResult eager =
      ex::train<Model>(c, Device::cpu(), ex::Mode::kEager, steps, autocast);
  EXPECT_LT(eager.last_loss, 0.25 * eager.first_loss) << eager.first_loss << " -> "
                                                      << eager.last_loss;
  for (ex::Mode m :
       {ex::Mode::kBackwardGraph, ex::Mode::kStepGraph, ex::Mode::kStepGraphInBackward}) {
    const ex::TrainResult r = ex::train<Model>(c, Device::cpu(), m, steps, autocast);
    EXPECT_EQ(r.first_loss, eager.first_loss) << ex::mode_name(m);
    EXPECT_EQ(r.last_loss, eager.last_loss) << ex::mode_name(m);
    EXPECT_EQ(r.captures, 0u);
  }
  return eager;
}

TEST(ExamplesCpu, TheConvnetConvergesAndItsModesAgree) {
  expect_converges_and_modes_agree<ex::ConvnetModel>(
      {.batch = 32, .channels = 2, .image = 8, .c1 = 4, .c2 = 8, .classes = 4, .batches = 2,
       .lr = 1e-2, .noise = 0.5},
      40);
}

// Channels last: the same model NHWC throughout converges, its modes agree, and under Autocast
// too.
TEST(ExamplesCpu, AChannelsLastConvnetConvergesAndItsModesAgreeInFloat32AndUnderAutocast) {
  const ex::ConvnetConfig c{.batch = 32, .channels = 2, .image = 8, .c1 = 4, .c2 = 8,
                            .classes = 4, .batches = 2, .lr = 1e-2, .noise = 0.5,
                            .channels_last = true};
  expect_converges_and_modes_agree<ex::ConvnetModel>(c, 40);
  expect_converges_and_modes_agree<ex::ConvnetModel>(c, 40, /*autocast=*/true);
}

TEST(ExamplesCpu, TheTransformerConvergesAndItsModesAgree) {
  expect_converges_and_modes_agree<ex::TransformerModel>(
      {.batch = 4, .seq = 8, .dim = 16, .heads = 2, .ff = 32, .vocab = 8, .batches = 2,
       .lr = 1e-2},
      60);
}

TEST(ExamplesCpu, ACausalTransformerOfTwoBlocksConvergesAndItsModesAgree) {
  expect_converges_and_modes_agree<ex::TransformerModel>({.batch = 4,
                                                          .seq = 8,
                                                          .dim = 16,
                                                          .heads = 2,
                                                          .ff = 32,
                                                          .vocab = 8,
                                                          .batches = 2,
                                                          .lr = 1e-2,
                                                          .blocks = 2,
                                                          .causal = true},
                                                         60);
}

TEST(ExamplesCpu, ACausalTransformerUnderAutocastConvergesAndEndsWithin2PercentOfFloat32) {
  const ex::TransformerConfig c{.batch = 4, .seq = 8, .dim = 16, .heads = 2, .ff = 32,
                                .vocab = 8, .batches = 2, .lr = 1e-2, .blocks = 2,
                                .causal = true};
  const ex::TrainResult f32 = ex::train<ex::TransformerModel>(c, Device::cpu(), ex::Mode::kEager,
                                                              60);
  const ex::TrainResult b16 = expect_converges_and_modes_agree<ex::TransformerModel>(c, 60, true);
  EXPECT_NE(b16.last_loss, f32.last_loss) << "the products ran in bfloat16";
  EXPECT_NEAR(b16.first_loss, f32.first_loss, 0.02 * f32.first_loss);
  EXPECT_LE(b16.last_loss, 1.02 * f32.last_loss)
      << "bf16 " << b16.first_loss << " -> " << b16.last_loss << ", fp32 " << f32.first_loss
      << " -> " << f32.last_loss;
}

// Causal attention end to end: a position's logits do not depend on the tokens after it — the
// tokens from position 5 on changed, positions 0-4 give the same logits bitwise, position 5 on
// not. Without the mask every position sees the change. Two blocks (the mask in each), two
// configurations.
TEST(ExamplesCpu, ACausalTransformersLogitsAtAPositionIgnoreTheTokensAfterIt) {
  for (bool causal : {true, false}) {
    const ex::TransformerConfig c{.batch = 2,
                                  .seq = 8,
                                  .dim = 16,
                                  .heads = 2,
                                  .ff = 32,
                                  .vocab = 8,
                                  .batches = 1,
                                  .blocks = 2,
                                  .causal = causal};
    const ex::TransformerModel model(c, Device::cpu());
    std::vector<std::int32_t> ids{1, 2, 3, 4, 5, 6, 7, 0, 3, 3, 1, 0, 2, 7, 5, 4};
    const std::vector<float> before = model.logits(from_vector(ids, {2, 8})).to_vector<float>();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i % 8 >= 5) ids[i] = (ids[i] + 3) % 8;
    }
    const std::vector<float> after = model.logits(from_vector(ids, {2, 8})).to_vector<float>();
    for (std::size_t row = 0; row < 16; ++row) {
      const bool earlier = row % 8 < 5;
      const std::vector<float> a(before.begin() + row * 8, before.begin() + row * 8 + 8),
          b(after.begin() + row * 8, after.begin() + row * 8 + 8);
      if (causal && earlier) {
        EXPECT_EQ(a, b) << "position " << row % 8 << " of sequence " << row / 8;
      } else {
        EXPECT_NE(a, b) << "position " << row % 8 << " of sequence " << row / 8
                        << " causal=" << causal;
      }
    }
  }
}

}  // namespace
}  // namespace graphward
