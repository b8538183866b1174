// Note [Step arena] on the CPU backend: the same addresses every step; a tensor kept from an
// earlier step is never overwritten and costs only its own slot; a changed step records anew and
// the next such step is stable again; nothing outside a step is served; the arena may die before
// its tensors.
#include "test_util.h"

namespace graphward {
namespace {

struct Model {
  Tensor w = randn({8, 8}, 1).set_requires_grad(true);
  Tensor b = randn({8}, 2).set_requires_grad(true);
  // The data pointers of every tensor the step makes, in order, and the loss.
  std::pair<std::vector<const void*>, Tensor> step(std::int64_t batch, std::uint64_t seed) const {
    std::vector<const void*> ptrs;
    const Tensor x = randn({batch, 8}, seed);
    const Tensor h = relu(linear(x, w, b));
    const Tensor loss = mse_loss(h, zeros({batch, 8}));
    for (const Tensor* t : {&x, &h, &loss}) ptrs.push_back(t->raw_data());
    backward(loss, {.grad_write = GradWrite::kOverwrite});
    return {ptrs, loss};
  }
};

TEST(StepArena, EveryStepGetsTheSameAddresses) {
  Model m;
  StepArena arena(Device::cpu());
  std::vector<std::vector<const void*>> seen;
  for (int s = 0; s < 4; ++s) {
    StepScope step(arena);
    seen.push_back(m.step(5, 100 + s).first);
  }
  for (int s = 1; s < 4; ++s) EXPECT_EQ(seen[s], seen[0]) << "step " << s;
  const StepArena::Stats st = arena.stats();
  EXPECT_EQ(st.steps, 4u);
  EXPECT_GT(st.recorded, 0u);
  // Every later step is served entirely from the slots, except the two .grad buffers: the first
  // backward allocated them (in the step, so from the arena) and they persist, held by w and b.
  EXPECT_EQ(st.served, 3 * (st.recorded - 2));
  EXPECT_EQ(st.held, 0u);
  EXPECT_EQ(st.rerecords, 0u);
  // Outside a step nothing is served by the arena.
  const Tensor outside = randn({5, 8}, 1);
  for (const void* p : seen[0]) EXPECT_NE(outside.raw_data(), p);
}

TEST(StepArena, ATensorKeptFromAnEarlierStepIsNeverOverwritten) {
  Model m;
  StepArena arena(Device::cpu());
  Tensor kept;
  std::vector<double> kept_values;
  std::vector<const void*> first;
  {
    StepScope step(arena);
    auto [ptrs, loss] = m.step(5, 1);
    first = ptrs;
    kept = loss;  // e.g. last step's loss, printed later
    kept_values = testing::values(kept);
  }
  for (int s = 0; s < 3; ++s) {
    StepScope step(arena);
    const auto ptrs = m.step(5, 50 + s).first;
    EXPECT_NE(ptrs[2], first[2]) << "the kept loss's slot must not be handed out";
    EXPECT_EQ(ptrs[0], first[0]);
    EXPECT_EQ(ptrs[1], first[1]);
  }
  EXPECT_EQ(testing::values(kept), kept_values);
  EXPECT_EQ(arena.stats().held, 3u);
  EXPECT_EQ(arena.stats().rerecords, 0u);
}

TEST(StepArena, AChangedStepRecordsAnewAndTheNextOneIsStable) {
  Model m;
  StepArena arena(Device::cpu());
  std::vector<const void*> a, b1, b2;
  {
    StepScope step(arena);
    a = m.step(5, 1).first;
  }
  {
    StepScope step(arena);
    b1 = m.step(7, 2).first;  // another batch size: diverges at the first allocation
  }
  EXPECT_EQ(arena.stats().rerecords, 1u);
  {
    StepScope step(arena);
    b2 = m.step(7, 3).first;
  }
  EXPECT_EQ(b2, b1);
  EXPECT_EQ(arena.stats().rerecords, 1u);
}

TEST(StepArena, StepsDoNotNestAndTheArenaMayDieBeforeItsTensors) {
  Model m;
  Tensor survivor;
  {
    StepArena arena(Device::cpu());
    StepScope step(arena);
    GW_EXPECT_ERROR(StepScope nested{arena}, "do not nest");
    survivor = full({16}, 3.0);
  }  // the arena is gone; the survivor owns its memory now
  EXPECT_EQ(survivor.to_vector<float>(), std::vector<float>(16, 3.0f));
  survivor = Tensor();  // freed by its storage
  // A new arena works as before.
  StepArena again(Device::cpu());
  for (int s = 0; s < 2; ++s) {
    StepScope step(again);
    m.step(5, s);
  }
  EXPECT_EQ(again.stats().rerecords, 0u);
}

TEST(StepArena, ReusedMemoryIsPoisonedWhenPoisoningIsOn) {
  StepArena arena(Device::cpu());
  {
    StepScope step(arena);
    const Tensor t = full({4}, 1.0);
  }
  debug::set_poison_new_memory(true);
  {
    StepScope step(arena);
    const Tensor t = Tensor::empty({4});
    for (double v : testing::values(t)) EXPECT_TRUE(std::isnan(v));
  }
  debug::set_poison_new_memory(false);
}

}  // namespace
}  // namespace graphward
