// GPT-2 (examples/gpt2.h) on the GPU at a small width and depth, as train_gpt2 runs it: llm.c's
// initialization gives a first loss of ln(vocab) in float32 and under Autocast (bfloat16 matrix
// products, cuDNN's fused causal attention); it trains with llm.c's recipe (the schedule,
// clipping, decay on the matrices); two micro-batches a step give the losses of one batch twice
// their size — in the backward-graph mode through two captured backwards, the first writing the
// gradients and the second adding to them; every graph is captured once and reads each step's
// new batch tensors without an update; the graph modes' losses are the eager ones within
// rounding.
#include <cmath>
#include <initializer_list>

#include "examples/gpt2.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace ex = graphward::examples;

ex::Gpt2Config small() {
  return {.batch = 4, .seq = 64, .depth = 2, .width = 128, .heads = 4, .vocab = 1000,
          .padded_vocab = 1024, .max_seq = 128, .batches = 4, .lr = 1e-3};
}

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<double>> params;
  std::uint64_t captures = 0, updates = 0;
};

// `steps` steps of a trainer over the batches of d, each step's accum micro-batches cut from one
// batch's rows (new tensors every step, as a training loop makes them).
Trained train_steps(const ex::Gpt2TrainConfig& c, ex::Mode m, const ex::Batches& d, int steps) {
  ex::Gpt2Trainer t(c, Device::cuda(0), m);
  Trained r;
  const std::int64_t rows = c.model.batch, seq = c.model.seq;
  for (int s = 0; s < steps; ++s) {
    const std::size_t b = static_cast<std::size_t>(s) % d.x.size();
    std::vector<Tensor> x, y;
    for (int k = 0; k < c.accum; ++k) {
      x.push_back(testing::narrow_rows(d.x[b], k * rows, rows));
      y.push_back(testing::narrow_rows(d.t[b].view({rows * c.accum, seq}), k * rows, rows)
                      .view({rows * seq}));
    }
    r.losses.push_back(t.step(x, y).item());
  }
  for (const Tensor& p : t.model().params()) r.params.push_back(testing::values(p));
  r.captures = t.captures();
  r.updates = t.updates();
  EXPECT_EQ(t.optimizer().steps(), steps) << ex::mode_name(m);
  return r;
}

void expect_modes_agree(const ex::Gpt2TrainConfig& c, const ex::Batches& d, int steps,
                        double tolerance,
                        std::initializer_list<ex::Mode> modes = {ex::Mode::kBackwardGraph,
                                                                 ex::Mode::kStepGraph}) {
  const Trained eager = train_steps(c, ex::Mode::kEager, d, steps);
  EXPECT_NEAR(eager.losses.front(), std::log(static_cast<double>(c.model.vocab)), 0.1);
  EXPECT_LT(eager.losses.back(), 0.7 * eager.losses.front())
      << eager.losses.front() << " -> " << eager.losses.back();
  for (ex::Mode m : modes) {
    const Trained r = train_steps(c, m, d, steps);
    EXPECT_EQ(r.captures, 1u) << ex::mode_name(m);
    EXPECT_EQ(r.updates, 0u) << ex::mode_name(m);
    ASSERT_EQ(r.losses.size(), eager.losses.size());
    for (std::size_t s = 0; s < r.losses.size(); ++s) {
      EXPECT_NEAR(r.losses[s], eager.losses[s], tolerance * eager.losses.front())
          << ex::mode_name(m) << " step " << s;
    }
  }
}

// The same run of 40 steps in float32 and under Autocast, each its own test; under Autocast each
// graph mode is a test of its own, beside the eager run it is compared with (racecheck, which
// instruments cuBLAS's bfloat16 kernels too, ran the three modes past 565 s in one process).
ex::Gpt2TrainConfig forty_steps() {
  return {.model = small(), .warmup_steps = 5, .total_steps = 40, .final_lr_fraction = 0.1};
}

TEST(ExamplesCuda, Gpt2StartsAtLnVocabTrainsAndItsModesAgreeInFloat32) {
  GW_REQUIRE_GPU();
  const ex::Gpt2TrainConfig c = forty_steps();
  expect_modes_agree(c, ex::Gpt2Model::data(c.model, Device::cuda(0)), 40, 1e-4);
}

// The 40 steps under Autocast: the eager run and the graph mode `m`.
void expect_mode_agrees_in_bf16(ex::Mode m) {
  ex::Gpt2TrainConfig c = forty_steps();
  c.bf16 = true;
  expect_modes_agree(c, ex::Gpt2Model::data(c.model, Device::cuda(0)), 40, 2e-2, {m});
}

TEST(ExamplesCuda, Gpt2StartsAtLnVocabTrainsAndItsBackwardGraphAgreesInBFloat16) {
  GW_REQUIRE_GPU();
  expect_mode_agrees_in_bf16(ex::Mode::kBackwardGraph);
}

TEST(ExamplesCuda, Gpt2StartsAtLnVocabTrainsAndItsStepGraphAgreesInBFloat16) {
  GW_REQUIRE_GPU();
  expect_mode_agrees_in_bf16(ex::Mode::kStepGraph);
}

// Two micro-batches of two sequences a step: the losses and parameters of one batch of four, in
// every mode (two backward graphs a step in the backward-graph mode, the second adding to the
// first's gradients).
TEST(ExamplesCuda, Gpt2sMicroBatchesAccumulateAsOneBatchInEveryMode) {
  GW_REQUIRE_GPU();
  ex::Gpt2TrainConfig one{.model = small(), .warmup_steps = 2, .total_steps = 6,
                          .final_lr_fraction = 0.1};
  const ex::Batches d = ex::Gpt2Model::data(one.model, Device::cuda(0));
  const Trained whole = train_steps(one, ex::Mode::kEager, d, 6);
  ex::Gpt2TrainConfig two = one;
  two.accum = 2;
  two.model.batch = 2;
  for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kBackwardGraph, ex::Mode::kStepGraph}) {
    const Trained r = train_steps(two, m, d, 6);
    for (std::size_t s = 0; s < r.losses.size(); ++s) {
      EXPECT_NEAR(r.losses[s], whole.losses[s], 1e-5 * whole.losses.front())
          << ex::mode_name(m) << " step " << s;
    }
    ASSERT_EQ(r.params.size(), whole.params.size());
    for (std::size_t i = 0; i < r.params.size(); ++i) {
      if (i >= 2 && (i - 2) % 12 == 3) continue;  // a QKV bias: K's third has no gradient, only
                                                  // rounding that AdamW's normalized step grows
      EXPECT_LT(testing::rel_error(r.params[i], whole.params[i]), 1e-4)
          << ex::mode_name(m) << " parameter " << i;
    }
    // The backward graph captures two programs, each once: the first micro-batch's backward
    // writes the gradients, the second's adds to them. The full step is one program.
    if (m != ex::Mode::kEager) {
      EXPECT_EQ(r.captures, m == ex::Mode::kBackwardGraph ? 2u : 1u) << ex::mode_name(m);
    }
    EXPECT_EQ(r.updates, 0u) << ex::mode_name(m);
  }
}

}  // namespace
}  // namespace graphward
