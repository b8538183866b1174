// GPT-2 (examples/gpt2.h) on the CPU backend, at a tiny width and depth: llm.c's initialization
// gives a first loss of ln(vocab); it trains; its modes give the same losses; the padded
// vocabulary's rows stay out of the loss; the tied embedding's gradient is both uses'.
#include "examples/gpt2.h"

#include <cmath>

#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

ex::Gpt2Config tiny() {
  return {.batch = 4, .seq = 16, .depth = 2, .width = 32, .heads = 4, .vocab = 61,
          .padded_vocab = 64, .max_seq = 32, .batches = 2, .lr = 3e-3};
}

TEST(ExamplesCpu, Gpt2sFirstLossIsLnVocabAndItTrainsAndItsModesAgree) {
  const ex::Gpt2Config c = tiny();
  const ex::TrainResult eager = ex::train<ex::Gpt2Model>(c, Device::cpu(), ex::Mode::kEager, 60);
  EXPECT_NEAR(eager.first_loss, std::log(61.0), 0.1);
  EXPECT_LT(eager.last_loss, 0.7 * eager.first_loss)
      << eager.first_loss << " -> " << eager.last_loss;
  for (ex::Mode m : {ex::Mode::kBackwardGraph, ex::Mode::kStepGraph}) {
    const ex::TrainResult r = ex::train<ex::Gpt2Model>(c, Device::cpu(), m, 60);
    EXPECT_EQ(r.first_loss, eager.first_loss) << ex::mode_name(m);
    EXPECT_EQ(r.last_loss, eager.last_loss) << ex::mode_name(m);
  }
}

TEST(ExamplesCpu, Gpt2sLlmcInitializationAndItsPaddedVocabularyStayOutOfTheLoss) {
  const ex::Gpt2Config c = tiny();
  const ex::Gpt2Model model(c, Device::cpu());
  const std::vector<Tensor> p = model.params();
  ASSERT_EQ(p.size(), 2u + 12u * 2 + 2u);
  // 64·32 + 32·32 + 2·(12·32·32 + 13·32) + 2·32
  EXPECT_EQ(model.parameter_count(), 64 * 32 + 32 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 64);
  EXPECT_EQ(ex::Gpt2Model::parameter_count(c), model.parameter_count());
  EXPECT_EQ(ex::Gpt2Model::parameter_count(ex::Gpt2Config::d12()), 124475904)
      << "llm.c's d12 (its num_parameters)";
  const std::vector<float> wte = p[0].to_vector<float>();
  for (std::size_t i = 61 * 32; i < wte.size(); ++i) ASSERT_EQ(wte[i], 0.f) << i;
  auto stddev = [](const Tensor& t, std::size_t count) {
    const std::vector<float> v = t.to_vector<float>();
    double s = 0;
    for (std::size_t i = 0; i < count; ++i) s += static_cast<double>(v[i]) * v[i];
    return std::sqrt(s / static_cast<double>(count));
  };
  EXPECT_NEAR(stddev(p[0], 61 * 32), 0.02, 0.002);
  EXPECT_NEAR(stddev(p[4], 96 * 32), 0.02, 0.002);               // block 0's qkv
  EXPECT_NEAR(stddev(p[6], 32 * 32), 0.02 / std::sqrt(4.0), 0.002);  // its attention projection
  EXPECT_NEAR(stddev(p[12], 32 * 128), 0.02 / std::sqrt(4.0), 0.001);  // its MLP projection
  const ex::Batches d = ex::Gpt2Model::data(c, Device::cpu());
  const Tensor logits = model.logits(d.x[0]);
  EXPECT_EQ(logits.shape(), Shape({64, 61}));
  // After a backward, the padded rows of the tied embedding have no gradient (no token picks
  // them, and their logits are cut off before the loss); the real rows have both uses'.
  backward(model.loss(d.x[0], d.t[0]));
  const std::vector<float> g = p[0].grad().to_vector<float>();
  for (std::size_t i = 61 * 32; i < g.size(); ++i) ASSERT_EQ(g[i], 0.f) << i;
  double real = 0;
  for (std::size_t i = 0; i < 61 * 32; ++i) real += std::abs(g[i]);
  EXPECT_GT(real, 0);
  GW_EXPECT_ERROR((void)model.logits(from_vector(std::vector<std::int32_t>(4 * 8, 1), {4, 8})),
                  "Gpt2Model", "expected [batch, 16]");
  GW_EXPECT_ERROR(ex::Gpt2Model({.width = 30, .heads = 4}, Device::cpu()), "width 30",
                  "multiple of heads");
  GW_EXPECT_ERROR(ex::Gpt2Model({.vocab = 100, .padded_vocab = 99}, Device::cpu()), "vocab 100",
                  "padded to 99");
  GW_EXPECT_ERROR(ex::Gpt2Model({.seq = 2048}, Device::cpu()), "seq 2048");
}

}  // namespace
}  // namespace graphward
