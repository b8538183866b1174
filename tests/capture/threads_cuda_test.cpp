// Graph owners and threads on the GPU: a BackwardGraph refuses a thread other than its own (one a
// thread replays side by side), one StepGraph serves two threads each with its own model on its own
// stream; and what a captured step refuses by name (empty_cache, a BackwardGraph inside it).
#include <atomic>
#include <barrier>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaThreads : public testing::PoisonedCudaTest {};

struct Model {
  Tensor w1, w2;
  explicit Model(std::uint64_t seed)
      : w1(mul(randn({64, 32}, seed, kF32Gpu), 0.2).detach().set_requires_grad(true)),
        w2(mul(randn({16, 64}, seed + 1, kF32Gpu), 0.2).detach().set_requires_grad(true)) {}
  // This step's batch (made on the host and uploaded: outside any capture).
  static std::vector<Tensor> batch(std::uint64_t step) {
    return {randn({32, 32}, 100 + step, kF32Gpu), randn({32, 16}, 200 + step, kF32Gpu)};
  }
  Tensor loss(const std::vector<Tensor>& b) const {
    return mse_loss(linear(linear(b[0], w1, Tensor(), Activation::kGelu), w2), b[1]);
  }
  Tensor loss(std::uint64_t step) const { return loss(batch(step)); }
};

// A BackwardGraph serves the thread that made it: another thread's backward is refused by name (a
// shared one crashed in the first steps); one BackwardGraph a thread, each with its own model and
// stream, run side by side, and every step's .grads are those of the eager backward, bitwise.
TEST_F(CudaThreads, ABackwardGraphRefusesAnotherThreadAndOneAThreadReplaysItsModelBitwise) {
  constexpr int kSteps = 30;
  Model models[2] = {Model(1), Model(5)}, refs[2] = {Model(1), Model(5)};
  std::vector<std::vector<float>> want[2];
  for (int t = 0; t < 2; ++t) {
    for (int s = 0; s < kSteps; ++s) {
      backward(refs[t].loss(s), {.grad_write = GradWrite::kOverwrite});
      want[t].push_back(refs[t].w1.grad().to_vector<float>());
    }
  }
  {
    BackwardGraph mine(kGpu);
    std::string refused;
    std::thread([&] {
      try {
        mine.backward(models[1].loss(0), GradWrite::kOverwrite);
      } catch (const Error& e) {
        refused = e.what();
      }
    }).join();
    EXPECT_NE(refused.find("serves thread"), std::string::npos) << refused;
  }
  std::atomic<int> wrong[2] = {0, 0};
  std::atomic<std::uint64_t> replays[2] = {0, 0};
  std::barrier<> start(2);
  std::string failed[2];  // what a thread's steps threw: reported, never a terminate
  auto run = [&](int me) {
    int s = 0;
    // Declared out here (the stream first: it outlives the graph) so that a failure can say how
    // the graph got there.
    std::optional<Stream> own;
    std::optional<BackwardGraph> bw;
    try {
      own.emplace(kGpu);
      StreamGuard on(*own);
      bw.emplace(kGpu);
      for (; s < kSteps; ++s) {
        if (s % 10 == 0) start.arrive_and_wait();
        bw->backward(models[me].loss(s), GradWrite::kOverwrite);
        if (models[me].w1.grad().to_vector<float>() != want[me][s]) ++wrong[me];
      }
      replays[me] = bw->stats().counters.replays;
      bw.reset();  // on its own stream, as it ran
    } catch (const std::exception& e) {
      failed[me] = "step " + std::to_string(s) + ": " + e.what();
      if (bw) {  // how the graph got there: its captures, updates and last decision
        const BackwardGraphStats st = bw->stats();
        failed[me] += " [captures " + std::to_string(st.counters.captures) + ", updates " +
                      std::to_string(st.counters.updates) + ", replays " +
                      std::to_string(st.counters.replays) + "; last: " + st.reason + "]";
      }
      start.arrive_and_drop();  // the other thread does not wait for this one again
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(failed[0], "");
  EXPECT_EQ(failed[1], "");
  EXPECT_EQ(wrong[0].load(), 0);
  EXPECT_EQ(wrong[1].load(), 0);
  EXPECT_GE(replays[0].load(), 20u);
  EXPECT_GE(replays[1].load(), 20u);
}

// One StepGraph, two threads, each stepping its own model with its own optimizer on its own
// stream: each model ends where the same steps taken alone leave it, bitwise (the graph is
// captured again whenever the other thread's step came last: it serves its capturing thread).
TEST_F(CudaThreads, OneStepGraphServesTwoThreadsAndEachModelTrainsAsAlone) {
  constexpr int kSteps = 10;
  auto train_alone = [](std::uint64_t seed) {
    Model m(seed);
    Sgd opt({m.w1, m.w2}, {.lr = 0.05});
    for (int s = 0; s < kSteps; ++s) {
      backward(m.loss(s), {.grad_write = GradWrite::kOverwrite});
      opt.step();
    }
    return m.w1.to_vector<float>();
  };
  const std::vector<float> want[2] = {train_alone(1), train_alone(5)};
  StepGraph graph(kGpu);
  Model models[2] = {Model(1), Model(5)};
  Sgd opt0({models[0].w1, models[0].w2}, {.lr = 0.05}),
      opt1({models[1].w1, models[1].w2}, {.lr = 0.05});
  Sgd* opts[2] = {&opt0, &opt1};
  auto run = [&](int me) {
    Stream own(kGpu);
    StreamGuard on(own);
    for (int s = 0; s < kSteps; ++s) {
      (void)graph.run(Model::batch(s), [&](const std::vector<Tensor>& b) {
        const Tensor loss = models[me].loss(b);
        backward(loss, {.grad_write = GradWrite::kOverwrite});
        opts[me]->step();
        return loss;
      });
    }
    GW_CUDA_CHECK(cudaStreamSynchronize(own.get()));
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(models[0].w1.to_vector<float>(), want[0]);
  EXPECT_EQ(models[1].w1.to_vector<float>(), want[1]);
}

// Set when the thread that set it has ended: its destructor runs after the thread's later
// thread-locals' (its cuBLAS handles, made after it), so after their destruction.
struct ExitMark {
  std::atomic<bool>* ended = nullptr;
  ~ExitMark() {
    if (ended) ended->store(true);
  }
};
thread_local ExitMark t_exit_mark;

// Note [Device-wide waits and other threads' captures]: a thread that ends while another thread
// captures destroys its cuBLAS handles, which synchronizes the device; that waits for the capture
// to end instead of invalidating it (a two-thread loop lost the other thread's capture whenever one
// thread ended first). The capture, held open with the thread's end queued behind it, succeeds;
// the step replays; the model trains as it does eagerly, bitwise.
TEST_F(CudaThreads, AThreadEndingWhileAnotherCapturesWaitsForTheCaptureToEnd) {
  constexpr int kSteps = 4;
  Model alone(3), m(3);
  {
    Sgd opt({alone.w1, alone.w2}, {.lr = 0.05});
    for (int s = 0; s < kSteps; ++s) {
      backward(alone.loss(s), {.grad_write = GradWrite::kOverwrite});
      opt.step();
    }
  }
  std::atomic<bool> may_end{false}, ended{false};
  std::thread other([&] {
    t_exit_mark.ended = &ended;  // first: destroyed after the handles made below
    Stream own(kGpu);
    StreamGuard on(own);
    Model mine(11);
    const std::vector<float> y = mine.loss(0).to_vector<float>();  // its GEMMs: its cuBLAS handles
    EXPECT_EQ(y.size(), 1u);
    while (!may_end.load()) std::this_thread::yield();
  });
  int underway = -1;
  bool ended_inside = true;
  StepGraph graph(kGpu);
  Sgd opt({m.w1, m.w2}, {.lr = 0.05});
  for (int s = 0; s < kSteps; ++s) {
    (void)graph.run(Model::batch(s), [&](const std::vector<Tensor>& b) {
      const Tensor loss = m.loss(b);
      if (capturing() && !may_end.exchange(true)) {
        // The other thread ends now, inside this capture; its handles' destruction waits.
        underway = detail::captures_underway(0);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ended_inside = ended.load();
      }
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      return loss;
    });
  }
  other.join();
  EXPECT_EQ(underway, 1);
  EXPECT_FALSE(ended_inside) << "the other thread ended (its cuBLAS handles destroyed) while this "
                                "thread's capture was underway";
  EXPECT_TRUE(ended.load());
  EXPECT_EQ(graph.counters().captures, 1u) << graph.last_reason();
  EXPECT_GE(graph.counters().replays, 2u);
  EXPECT_EQ(m.w1.to_vector<float>(), alone.w1.to_vector<float>());
}

// Inside a captured step, empty_cache (it surfaced later as an invalid value in a kernel's launch
// check) and a BackwardGraph (a bare cudaErrorStreamCaptureIsolation) are refused by name; no
// capture is left open and the next steps capture and replay.
TEST_F(CudaThreads, EmptyCacheAndABackwardGraphInsideACapturedStepAreRefusedByName) {
  Model m(9);
  Sgd opt({m.w1, m.w2}, {.lr = 0.05});
  BackwardGraph inner(kGpu);
  for (int which = 0; which < 2; ++which) {
    StepGraph step(kGpu);
    const std::vector<Tensor> batch = Model::batch(0);
    auto body = [&](bool misuse) {
      return [&, misuse](const std::vector<Tensor>& b) {
        const Tensor loss = m.loss(b);
        if (misuse && which == 0) empty_cache(kGpu);
        if (misuse && which == 1) {
          inner.backward(loss, GradWrite::kOverwrite);
        } else {
          backward(loss, {.grad_write = GradWrite::kOverwrite});
        }
        opt.step();
        return loss;
      };
    };
    (void)step.run(batch, body(false));  // the warm-up
    GW_EXPECT_ERROR((void)step.run(batch, body(true)),
                    which == 0 ? "empty_cache" : "BackwardGraph::backward inside a capture");
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    GW_CUDA_CHECK(cudaStreamIsCapturing(current_stream(kGpu), &status));
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
    (void)step.run(batch, body(false));
    (void)step.run(batch, body(false));
    EXPECT_GE(step.counters().replays, 2u);
  }
}

}  // namespace
}  // namespace graphward
