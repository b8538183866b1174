// Note [Deferred release] on the CPU backend (the worker and what it drops are backend-neutral):
// a node handed off is released at once and its saved tensors are dropped on the worker's thread;
// a StepScope begun meanwhile waits for them, so the next step's allocations find the arena's
// slots free; one release is in flight at a time; a destroyed worker finishes its release.
#include <chrono>
#include <functional>
#include <thread>

#include "graphward/engine/tape/deferred_release.h"
#include "test_util.h"

namespace graphward {
namespace {

struct Step {
  Tensor w = randn({8, 8}, 1).set_requires_grad(true);
  // A recorded forward: x -> linear -> relu -> mse against zeros.
  Tensor loss(std::uint64_t seed) const {
    return mse_loss(relu(linear(randn({5, 8}, seed), w)), zeros({5, 8}));
  }
};

// Every node of the tape of `loss`.
std::vector<Node*> nodes_of(const Tensor& loss) {
  std::vector<Node*> out, todo = {loss.grad_fn().get()};
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    if (std::find(out.begin(), out.end(), n) != out.end()) continue;
    out.push_back(n);
    for (const InputMeta& in : n->inputs()) {
      if (in.edge.node) todo.push_back(in.edge.node.get());
    }
  }
  return out;
}

// Hands the saved tensors of `loss`'s tape off (every node released here) and returns weak
// handles to their storages but the parameter's (the model keeps it), to see when they are gone.
std::vector<std::weak_ptr<Storage>> hand_off(const Tensor& loss, const Tensor& param,
                                             std::vector<SavedTensor>& out) {
  std::vector<std::weak_ptr<Storage>> storages;
  for (Node* n : nodes_of(loss)) {
    for (const SavedTensor& s : n->saved()) {
      if (s.tensor.defined() && s.tensor.storage() != param.storage()) {
        storages.push_back(s.tensor.storage());
      }
    }
    n->release_saved(&out, /*count_mutation=*/false);
    EXPECT_TRUE(n->released()) << n->label();
    EXPECT_TRUE(n->saved().empty()) << n->label();
  }
  return storages;
}

std::size_t alive(const std::vector<std::weak_ptr<Storage>>& storages) {
  std::size_t n = 0;
  for (const auto& s : storages) n += !s.expired();
  return n;
}

auto slow(std::thread::id* where) {
  return [where] {
    *where = std::this_thread::get_id();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
}

TEST(DeferredRelease, TheSavedTensorsAreDroppedOnTheWorkerAndTheNextStepWaitsForThem) {
  Step m;
  StepArena arena(Device::cpu());
  detail::ReleaseWorker worker;
  std::vector<SavedTensor> saved;
  std::thread::id where;
  std::vector<std::weak_ptr<Storage>> storages;
  {
    StepScope scope(arena);
    Tensor loss = m.loss(1);
    storages = hand_off(loss, m.w, saved);
    ASSERT_FALSE(saved.empty());
    worker.release(saved, std::move(loss), slow(&where));
    EXPECT_TRUE(saved.empty());      // handed over: the caller's buffer is an empty one
    EXPECT_GT(alive(storages), 0u);  // the worker sleeps before dropping them
  }
  const StepArena::Stats before = arena.stats();
  {
    StepScope scope(arena);  // waits for the worker: the slots are free again
    EXPECT_EQ(alive(storages), 0u);
    const Tensor loss = m.loss(2);
  }
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_NE(where, std::thread::id());
  const StepArena::Stats after = arena.stats();
  EXPECT_EQ(after.held, before.held) << "a slot was still held: the step did not wait";
  EXPECT_GT(after.served, before.served);
  // A second backward through a handed-off tape is refused by name, as after any release.
  const Tensor again = m.loss(3);
  std::vector<SavedTensor> more;
  hand_off(again, m.w, more);
  GW_EXPECT_ERROR(backward(again), "a second time");
}

TEST(DeferredRelease, OneReleaseIsInFlightAtATimeAndADestroyedWorkerFinishesIt) {
  Step m;
  std::vector<std::weak_ptr<Storage>> first, second;
  std::thread::id where;
  {
    detail::ReleaseWorker worker;
    std::vector<SavedTensor> saved;
    Tensor a = m.loss(1);
    first = hand_off(a, m.w, saved);
    worker.release(saved, std::move(a), slow(&where));
    Tensor b = m.loss(2);
    second = hand_off(b, m.w, saved);
    worker.release(saved, std::move(b), slow(&where));  // waits for the first
    EXPECT_EQ(alive(first), 0u);
    EXPECT_GT(alive(second), 0u);
  }  // the destructor finishes the second
  EXPECT_EQ(alive(second), 0u);
  detail::wait_for_releases();  // nothing left: returns at once
}

// Note [Waking the release worker]: hand-offs that find the worker spinning, asleep, or still busy
// with the last release (every path between the two sides' flags), each released once: a lost wake
// hangs here, a release dropped twice or never shows in the storages left alive.
TEST(DeferredRelease, EveryHandOffIsReleasedWhetherTheWorkerSpinsSleepsOrIsBusy) {
  Step m;
  detail::ReleaseWorker worker;
  std::vector<SavedTensor> saved;
  for (int i = 0; i < 120; ++i) {
    Tensor loss = m.loss(static_cast<std::uint64_t>(i) + 10);
    const std::vector<std::weak_ptr<Storage>> storages = hand_off(loss, m.w, saved);
    ASSERT_FALSE(storages.empty());
    std::function<void()> before;
    if (i % 7 == 3) {  // the worker still busy when the next hand-off or the wait comes
      before = [] { std::this_thread::sleep_for(std::chrono::microseconds(500)); };
    }
    worker.release(saved, std::move(loss), std::move(before));
    ASSERT_TRUE(saved.empty());
    if (i % 3 == 0) {
      detail::wait_for_releases();
      EXPECT_EQ(alive(storages), 0u) << "hand-off " << i;
    }
    if (i % 10 == 9) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin: it sleeps
    } else if (i % 2 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  detail::wait_for_releases();
}

}  // namespace
}  // namespace graphward
