// Hostile input, by class: tapes long enough that anything recursive per node overflows the stack.
// Each test runs on a thread with a 1 MiB stack (a pool worker's, or a small default), where the
// old recursive release of a tape failed at about 20,000 nodes; memory must come back whole.
#include <pthread.h>

#include <exception>
#include <functional>

#include "graphward/engine/ops/rnn.h"
#include "test_util.h"

namespace graphward {
namespace {

// Runs `body` on a new thread with a stack of `stack_bytes`; rethrows what it threw.
void on_small_stack(std::size_t stack_bytes, const std::function<void()>& body) {
  struct Job {
    const std::function<void()>* body;
    std::exception_ptr error;
  } job{&body, nullptr};
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr,
      [](void* p) -> void* {
        auto* j = static_cast<Job*>(p);
        try {
          (*j->body)();
        } catch (...) {
          j->error = std::current_exception();
        }
        return nullptr;
      },
      &job);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  if (job.error) std::rethrow_exception(job.error);
}

constexpr std::size_t kOneMiB = std::size_t{1} << 20;

// A chain of a million nodes: built, backward-ed and destroyed on a 1 MiB stack. The gradient is
// exact (each step multiplies by 1), and every node and byte comes back.
TEST(LongTape, AMillionNodeChainIsBuiltDifferentiatedAndFreedOnAOneMiBStack) {
  const std::size_t nodes_before = debug::live_nodes();
  const std::size_t bytes_before = host_bytes_in_use();
  on_small_stack(kOneMiB, [] {
    const Tensor x = from_vector(std::vector<float>{2.f}, {1}).set_requires_grad(true);
    Tensor y = x;
    for (int i = 0; i < 1'000'000; ++i) y = mul(y, 1.0);
    EXPECT_GE(debug::live_nodes(), 1'000'000u);
    backward(y);
    EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>{1.f});
    y = Tensor();  // the whole chain dies here, on this stack
  });
  EXPECT_EQ(debug::live_nodes(), nodes_before);
  EXPECT_EQ(host_bytes_in_use(), bytes_before);
}

// Dropped without a backward, and with retain_graph: the same chain, saving tensors this time
// (each mul by a tensor saves both operands).
TEST(LongTape, AChainThatSavesTensorsIsFreedOnAOneMiBStackWithOrWithoutABackward) {
  const std::size_t nodes_before = debug::live_nodes();
  const std::size_t bytes_before = host_bytes_in_use();
  on_small_stack(kOneMiB, [] {
    const Tensor x = from_vector(std::vector<float>{1.f, 2.f}, {2}).set_requires_grad(true);
    const Tensor one = ones({2});
    for (bool run_backward : {false, true}) {
      Tensor y = x;
      for (int i = 0; i < 200'000; ++i) y = mul(y, one);
      if (run_backward) {
        backward(sum(y), {.retain_graph = true});
        EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1.f, 1.f}));
      }
    }  // each chain dies with its last handle
  });
  EXPECT_EQ(debug::live_nodes(), nodes_before);
  EXPECT_EQ(host_bytes_in_use(), bytes_before);
}

// A node still held elsewhere stays alive while the rest of the chain goes: the release takes
// only what it alone owns.
TEST(LongTape, ANodeHeldElsewhereSurvivesTheReleaseOfTheChainAroundIt) {
  const Tensor x = from_vector(std::vector<float>{3.f}, {1}).set_requires_grad(true);
  Tensor y = x, middle;
  for (int i = 0; i < 1000; ++i) {
    y = mul(y, 1.0);
    if (i == 499) middle = y;
  }
  const std::size_t with_chain = debug::live_nodes();
  y = Tensor();
  EXPECT_EQ(debug::live_nodes(), with_chain - 500);  // nodes 500..999 went; 0..499 are middle's
  backward(middle);
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>{1.f});
}

// An LSTM unrolled over 100,000 steps (1.4 million nodes) on the CPU: trained one step, dropped,
// and the host memory it held is back.
TEST(LongTape, AnLstmUnrolledOverAHundredThousandStepsTrainsAndGivesItsMemoryBack) {
  const std::size_t nodes_before = debug::live_nodes();
  const std::size_t bytes_before = host_bytes_in_use();
  on_small_stack(kOneMiB, [] {
    const std::int64_t hidden = 2;
    const Tensor w_ih = mul(randn({4 * hidden, 1}, 1), 0.1).set_requires_grad(true);
    const Tensor w_hh = mul(randn({4 * hidden, hidden}, 2), 0.1).set_requires_grad(true);
    const Tensor b_ih = zeros({4 * hidden}).set_requires_grad(true);
    const Tensor b_hh = zeros({4 * hidden}).set_requires_grad(true);
    const Tensor x = ones({1, 1});
    LstmState s{zeros({1, hidden}), zeros({1, hidden})};
    for (int t = 0; t < 100'000; ++t) s = lstm_cell(x, s, w_ih, w_hh, b_ih, b_hh);
    backward(sum(s.h));
    for (const Tensor* w : {&w_ih, &w_hh, &b_ih, &b_hh}) {
      ASSERT_TRUE(w->grad().defined());
      for (float v : w->grad().to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
    }
  });
  EXPECT_EQ(debug::live_nodes(), nodes_before);
  EXPECT_EQ(host_bytes_in_use(), bytes_before);
}

}  // namespace
}  // namespace graphward
