// Hostile use across threads, by class: two threads sharing a tape prefix (backwards through one
// graph), a BackwardGraph, a StepGraph, an optimizer. Each runs GW_THREAD_ROUNDS rounds (default
// 10000) with both threads released together by a barrier, so that their calls overlap; built
// and run plain, under AddressSanitizer and UndefinedBehaviorSanitizer, and under
// ThreadSanitizer (scripts/test.sh).
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;
using testing::values;

int rounds() {
  const char* env = std::getenv("GW_THREAD_ROUNDS");
  return env && *env ? std::atoi(env) : 10000;
}

// Runs `body(thread, round)` on two threads for rounds() rounds, both starting each round together.
void two_threads(const std::function<void(int, int)>& body,
                 const std::function<void(int)>& between = {}) {
  const int n = rounds();
  std::barrier<> start(2), done(2);
  auto run = [&](int me) {
    for (int r = 0; r < n; ++r) {
      start.arrive_and_wait();
      body(me, r);
      done.arrive_and_wait();
      if (me == 0 && between) between(r);
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
}

// The graph two threads backpropagate through, h = gelu(x wᵀ), made anew (and w's .grad dropped)
// by make().
struct SharedPrefix {
  Tensor w = uniform({8, 8}, -0.5, 0.5, 1).set_requires_grad(true);
  Tensor h;
  SharedPrefix() { make(); }
  void make() {
    w.grad() = Tensor();
    h = gelu(linear(randn({4, 8}, 2), w));
  }
};

// The gradient of sum(k · gelu(x wᵀ)) for w, computed alone (the reference).
std::vector<double> reference_grad(double k) {
  SharedPrefix p;
  backward(sum(mul(p.h, k)));
  return values(p.w.grad());
}

// Two backwards without retain_graph through one graph (a prefix shared by two losses): exactly
// one of them runs — the other is refused, before anything is written, whether it came while the
// first was running ("while another backward runs through it") or after it ("a second time") —
// and the .grad is the winner's. Before the claims, one thread freed what the other read
// (heap-use-after-free under AddressSanitizer, a crash in the release build).
TEST(ThreadsSharingATape, TwoBackwardsThatFreeTheGraphRunOneAndRefuseTheOther) {
  const std::vector<double> g1 = reference_grad(1), g2 = reference_grad(2);
  SharedPrefix p;
  std::atomic<int> ran[2] = {0, 0};
  std::atomic<int> refused_running{0}, refused_again{0}, other_errors{0};
  std::string odd;
  std::mutex odd_mutex;
  int mismatches = 0;
  two_threads(
      [&](int me, int) {
        try {
          backward(sum(mul(p.h, me == 0 ? 1.0 : 2.0)));
          ++ran[me];
        } catch (const Error& e) {
          const std::string m = e.what();
          if (m.find("while another backward runs through it") != std::string::npos) {
            ++refused_running;
          } else if (m.find("a second time") != std::string::npos) {
            ++refused_again;
          } else {
            ++other_errors;
            std::lock_guard<std::mutex> lock(odd_mutex);
            odd = m;
          }
        }
      },
      [&](int r) {
        // Exactly one ran this round, and the .grad is its gradient alone.
        const int a = ran[0].exchange(0), b = ran[1].exchange(0);
        if (a + b != 1 || values(p.w.grad()) != (a ? g1 : g2)) ++mismatches;
        (void)r;
        p.make();
      });
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(other_errors.load(), 0) << odd;
  EXPECT_EQ(refused_running + refused_again, rounds());
}

// Two backwards that keep the graph (retain_graph) run side by side, and every contribution
// arrives (Note [Leaves shared across threads]); one that frees it beside one that keeps it:
// never a read of freed memory, and whichever ran wrote its whole gradient.
TEST(ThreadsSharingATape, BackwardsThatKeepTheGraphRunTogetherAndAFreeingOneNeverFreesUnderThem) {
  const std::vector<double> g1 = reference_grad(1), g2 = reference_grad(2);
  std::vector<double> g3(g1.size());
  for (std::size_t i = 0; i < g1.size(); ++i) g3[i] = g1[i] + g2[i];
  SharedPrefix p;
  std::atomic<int> ran[2] = {0, 0};
  std::atomic<int> errors{0};
  bool mixed = false;  // the second half of the rounds: thread 1 frees the graph
  int mismatches = 0;
  two_threads(
      [&](int me, int) {
        try {
          backward(sum(mul(p.h, me == 0 ? 1.0 : 2.0)), {.retain_graph = !(mixed && me == 1)});
          ++ran[me];
        } catch (const Error&) {
          ++errors;
        }
      },
      [&](int r) {
        const int a = ran[0].exchange(0), b = ran[1].exchange(0);
        const std::vector<double> g = values(p.w.grad());
        if (!mixed) {
          if (a + b != 2 || rel_error(g, g3) > 1e-6) ++mismatches;
        } else if (a + b == 0 || (a && b && rel_error(g, g3) > 1e-6) ||
                   (a + b == 1 && g != (a ? g1 : g2))) {
          ++mismatches;
        }
        mixed = r >= rounds() / 2;
        p.make();
      });
  EXPECT_EQ(mismatches, 0);
}

// A BackwardGraph serves the thread that made it: another thread's backward is refused by name
// (on the GPU it crashed), while one BackwardGraph a thread, over the threads' own models, gives
// every backward its own model's gradients.
TEST(ThreadsSharingABackwardGraph, AnotherThreadIsRefusedByNameAndOneAThreadWorks) {
  BackwardGraph shared(Device::cpu());
  Tensor w[2] = {uniform({6, 6}, -0.5, 0.5, 3).set_requires_grad(true),
                 uniform({6, 6}, -0.5, 0.5, 4).set_requires_grad(true)};
  std::vector<double> ref[2];
  for (int t = 0; t < 2; ++t) {
    backward(sum(relu(linear(randn({3, 6}, 10 + t), w[t]))), {.grad_write = GradWrite::kOverwrite});
    ref[t] = values(w[t].grad());
  }
  std::string refused;
  std::thread([&] {
    try {
      shared.backward(sum(relu(linear(randn({3, 6}, 11), w[1]))), GradWrite::kOverwrite);
    } catch (const Error& e) {
      refused = e.what();
    }
  }).join();
  EXPECT_NE(refused.find("BackwardGraph::backward on thread"), std::string::npos) << refused;
  EXPECT_NE(refused.find("serves thread"), std::string::npos) << refused;
  shared.backward(sum(relu(linear(randn({3, 6}, 10), w[0]))), GradWrite::kOverwrite);
  EXPECT_EQ(values(w[0].grad()), ref[0]);
  std::atomic<int> wrong{0};
  BackwardGraph* own[2] = {nullptr, nullptr};
  std::unique_ptr<BackwardGraph> made[2];
  two_threads([&](int me, int round) {
    if (round == 0) own[me] = (made[me] = std::make_unique<BackwardGraph>(Device::cpu())).get();
    own[me]->backward(sum(relu(linear(randn({3, 6}, 10 + me), w[me]))), GradWrite::kOverwrite);
    if (values(w[me].grad()) != ref[me]) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
}

// One StepGraph serving two threads, each stepping its own model with its own optimizer: after
// the rounds each model is where the same steps taken alone leave it.
TEST(ThreadsSharingAStepGraph, EachThreadsModelTrainsAsItWouldAlone) {
  const int n = rounds() / 10 + 1;
  auto model = [](int t) { return uniform({4, 4}, -0.5, 0.5, 20 + t).set_requires_grad(true); };
  auto step_of = [](const Tensor& w, Sgd& opt, int t) {
    return [&w, &opt, t] {
      Tensor loss = mse_loss(linear(randn({2, 4}, 30 + t), w), zeros({2, 4}));
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      return loss;
    };
  };
  std::vector<double> ref[2];
  for (int t = 0; t < 2; ++t) {
    const Tensor w = model(t);
    Sgd opt({w}, {.lr = 0.1});
    for (int i = 0; i < n; ++i) step_of(w, opt, t)();
    ref[t] = values(w);
  }
  StepGraph graph(Device::cpu());
  const Tensor w[2] = {model(0), model(1)};
  Sgd opt0({w[0]}, {.lr = 0.1}), opt1({w[1]}, {.lr = 0.1});
  Sgd* opts[2] = {&opt0, &opt1};
  std::barrier start(2);
  auto run = [&](int me) {
    for (int i = 0; i < n; ++i) {
      start.arrive_and_wait();
      graph.run(step_of(w[me], *opts[me], me));
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(values(w[0]), ref[0]);
  EXPECT_EQ(values(w[1]), ref[1]);
  EXPECT_EQ(graph.counters().eager, 2u * static_cast<std::uint64_t>(n));
}

// One optimizer stepped and zeroed by two threads at once: the steps run one at a time (the
// parameter is where 2 · rounds steps leave it, and each counted).
TEST(ThreadsSharingAnOptimizer, StepsFromTwoThreadsAreEachTakenOnce) {
  const Tensor p = full({16}, 1.0).set_requires_grad(true);
  const Tensor q = full({16}, 1.0).set_requires_grad(true);
  p.grad() = full({16}, 0.5);
  q.grad() = full({16}, 0.5);
  Sgd sgd({p}, {.lr = 1e-3});
  AdamW adamw({q}, {.lr = 0.0, .weight_decay = 0.0});  // lr 0: counts steps, moves nothing
  two_threads([&](int me, int) {
    sgd.step();
    adamw.step();
    adamw.zero_grad();
    if (me == 1) (void)sgd.steps();
  });
  double expect = 1.0;
  for (int i = 0; i < 2 * rounds(); ++i) {
    expect = static_cast<double>(static_cast<float>(expect) - static_cast<float>(1e-3) * 0.5f);
  }
  EXPECT_EQ(sgd.steps(0), 2 * rounds());
  EXPECT_EQ(adamw.steps(0), 2 * rounds());
  EXPECT_EQ(values(p), std::vector<double>(16, expect));
  EXPECT_EQ(values(q), std::vector<double>(16, 1.0));
}

}  // namespace
}  // namespace graphward
