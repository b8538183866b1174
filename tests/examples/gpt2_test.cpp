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
  EXPECT_EQ(logits.shape(), Shape({64, 64}));
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

// Gpt2Trainer: two micro-batches of two sequences step the parameters as one batch of four does
// (the mean loss's gradient accumulated: equal to rounding), in every mode bitwise alike; with
// llm.c's recipe (schedule, clipping, decay on the matrices only).
TEST(ExamplesCpu, Gpt2sMicroBatchesAccumulateAsOneBatchInEveryMode) {
  ex::Gpt2TrainConfig c{.model = tiny(), .accum = 2, .warmup_steps = 1, .total_steps = 4,
                        .final_lr_fraction = 0.1};
  c.model.batch = 2;
  ex::Gpt2TrainConfig one = c;
  one.accum = 1;
  one.model.batch = 4;
  ex::Gpt2Config big = one.model;
  big.batches = 3;
  const ex::Batches d = ex::Gpt2Model::data(big, Device::cpu());
  auto halves = [&](int b, std::vector<Tensor>& x, std::vector<Tensor>& y) {
    x = {testing::narrow_rows(d.x[b], 0, 2), testing::narrow_rows(d.x[b], 2, 2)};
    y = {testing::narrow_rows(d.t[b].view({4, 16}), 0, 2).view({32}),
         testing::narrow_rows(d.t[b].view({4, 16}), 2, 2).view({32})};
  };
  ex::Gpt2Trainer whole(one, Device::cpu(), ex::Mode::kEager);
  std::vector<std::vector<float>> reference;
  for (int b = 0; b < 3; ++b) reference.push_back(whole.step({d.x[b]}, {d.t[b]}).to_vector<float>());
  for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kBackwardGraph, ex::Mode::kStepGraph}) {
    ex::Gpt2Trainer t(c, Device::cpu(), m);
    for (int b = 0; b < 3; ++b) {
      std::vector<Tensor> x, y;
      halves(b, x, y);
      const float loss = t.step(x, y).item();
      EXPECT_NEAR(loss, reference[static_cast<std::size_t>(b)][0], 1e-5) << ex::mode_name(m);
    }
    const std::vector<Tensor> p = t.model().params(), q = whole.model().params();
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (i >= 2 && (i - 2) % 12 == 3) {
        // A block's QKV bias: K's third has no gradient (a softmax row does not change when the
        // same number is added to each score), only rounding noise, which AdamW's normalized
        // step turns into steps of the learning rate's size either way. Q's and V's thirds.
        const std::vector<float> a = p[i].to_vector<float>(), b = q[i].to_vector<float>();
        const std::size_t w = a.size() / 3;
        for (std::size_t third : {std::size_t{0}, std::size_t{2}}) {
          const Tensor pa = from_vector(std::vector<float>(a.begin() + third * w,
                                                           a.begin() + (third + 1) * w),
                                        {static_cast<std::int64_t>(w)});
          const Tensor pb = from_vector(std::vector<float>(b.begin() + third * w,
                                                           b.begin() + (third + 1) * w),
                                        {static_cast<std::int64_t>(w)});
          EXPECT_LT(testing::rel_error(pa, pb), 1e-5) << ex::mode_name(m) << " parameter " << i
                                                      << " third " << third;
        }
        continue;
      }
      EXPECT_LT(testing::rel_error(p[i], q[i]), 1e-5) << ex::mode_name(m) << " parameter " << i;
    }
    EXPECT_EQ(t.optimizer().steps(), 3);
  }
  GW_EXPECT_ERROR(ex::Gpt2Trainer(c, Device::cpu(), ex::Mode::kEager).step({d.x[0]}, {d.t[0]}),
                  "Gpt2Trainer::step", "expected 2 of each");
}

// Data parallelism with a group of one (the CPU's): every mode gives the losses and parameters
// of the run without a group, bitwise.
TEST(ExamplesCpu, Gpt2InAGroupOfOneTrainsAsWithoutOne) {
  ex::Gpt2TrainConfig c{.model = tiny(), .accum = 2};
  c.model.batch = 2;
  dist::ProcessGroup group({.rank = 0, .world_size = 1, .device = Device::cpu()});
  const ex::Batches d = ex::Gpt2Model::data(c.model, Device::cpu());
  for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kBackwardGraph, ex::Mode::kStepGraph}) {
    ex::Gpt2Trainer alone(c, Device::cpu(), m), grouped(c, Device::cpu(), m, &group);
    for (int step = 0; step < 3; ++step) {
      const std::vector<Tensor> x{d.x[0], d.x[1]}, y{d.t[0], d.t[1]};
      EXPECT_EQ(grouped.step(x, y).item(), alone.step(x, y).item()) << ex::mode_name(m);
    }
    const std::vector<Tensor> p = grouped.model().params(), q = alone.model().params();
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i].to_vector<float>(), q[i].to_vector<float>()) << ex::mode_name(m) << " " << i;
    }
  }
}

// A run checkpointed after 3 steps and resumed by a new trainer (parameters, AdamW's moments and
// counts, the schedule's place, the data position) ends bitwise where the uninterrupted run ends,
// eagerly and with the whole step replayed; another model's checkpoint is refused, nothing
// restored.
TEST(ExamplesCpu, AResumedGpt2RunIsBitwiseTheUninterruptedOne) {
  const testing::ScratchDir dir("graphward_gpt2_");
  const std::string shard = dir.path("s.bin"), ckpt = dir.path("run.ckpt");
  ex::Gpt2TrainConfig c{.model = tiny(), .accum = 2, .warmup_steps = 2, .total_steps = 8,
                        .final_lr_fraction = 0.1};
  c.model.batch = 2;
  ex::write_token_shard(shard, ex::synthetic_tokens(2 * 16 * 2 * 9 + 1, c.model.vocab, 5));
  auto run = [&](ex::Gpt2Trainer& t, ex::TokenShards& data, int from, int to) {
    std::vector<std::int32_t> xs, ys;
    for (int i = from; i < to; ++i) {
      std::vector<Tensor> x, y;
      for (int k = 0; k < c.accum; ++k) {
        data.next(xs, ys);
        x.push_back(from_vector(xs, {c.model.batch, c.model.seq}));
        y.push_back(from_vector(ys, {c.model.batch * c.model.seq}));
      }
      (void)t.step(x, y);
    }
  };
  for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kStepGraph}) {
    ex::Gpt2Trainer whole(c, Device::cpu(), m);
    ex::TokenShards d1({shard}, c.model.batch, c.model.seq, c.model.vocab);
    run(whole, d1, 0, 8);
    {
      ex::Gpt2Trainer first(c, Device::cpu(), m);
      ex::TokenShards d2({shard}, c.model.batch, c.model.seq, c.model.vocab);
      run(first, d2, 0, 3);
      first.save(ckpt, 3, d2.position());
    }
    ex::Gpt2Trainer resumed(c, Device::cpu(), m);
    const ex::Gpt2Trainer::Resumed r = resumed.load(ckpt);
    EXPECT_EQ(r.step, 3);
    ex::TokenShards d3({shard}, c.model.batch, c.model.seq, c.model.vocab);
    d3.seek(r.data);
    run(resumed, d3, 3, 8);
    const std::vector<Tensor> p = resumed.model().params(), q = whole.model().params();
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(p[i].to_vector<float>(), q[i].to_vector<float>())
          << ex::mode_name(m) << " parameter " << i;
    }
    EXPECT_EQ(resumed.optimizer().steps(), 8);
    EXPECT_EQ(d3.position(), d1.position());
  }
  // Another model's checkpoint (one block fewer): refused by name, the parameters untouched.
  ex::Gpt2TrainConfig small = c;
  small.model.depth = 1;
  ex::Gpt2Trainer other(small, Device::cpu(), ex::Mode::kEager);
  other.save(dir.path("small.ckpt"), 0, {});
  ex::Gpt2Trainer t(c, Device::cpu(), ex::Mode::kEager);
  const std::vector<float> before = t.model().params()[0].to_vector<float>();
  GW_EXPECT_ERROR((void)t.load(dir.path("small.ckpt")), "small.ckpt", "tensor 'adamw.step'",
                  "expected float64 [28]");
  EXPECT_EQ(t.model().params()[0].to_vector<float>(), before);
}

}  // namespace
}  // namespace graphward
