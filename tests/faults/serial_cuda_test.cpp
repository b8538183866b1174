// Tests that must run alone on the GPU (ctest RUN_SERIAL; not under compute-sanitizer): out of
// memory, in eager work and while capturing (they take the device's memory), and kernel faults
// (each in a child process: a fault loses the process's CUDA context, Note [Kernel faults]).
//   * an allocation the device cannot serve is an OutOfMemoryError that says what needed how
//     much and where; the library works afterwards;
//   * out of memory while capturing abandons the capture (none left open, nothing cached or
//     written) and the next steps capture, replay and give the eager gradients;
//   * a fault in a replayed backward is reported with the graph that ran and the loss of the
//     context, and the process exits cleanly; with GRAPHWARD_LOCALIZE_FAULTS=1 the backward runs
//     eagerly and the failing node is named;
//   * a replay whose collectives never finish (a kernel spinning on host memory stands in for the
//     dead peer) aborts its group within the collective timeout, naming the rank, the graph and
//     the replay, and the next launch is refused by name; a graph that outlives its group refuses
//     to launch (Note [Replay watchdog], dist/watchdog.h).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <chrono>
#include <optional>
#include <thread>

#include "graphward/capture/backward_graph.h"
#include "faults/fault_kernels.h"
#include "graphward/graphward_dist.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

TEST(CudaOutOfMemory, AnAllocationTheDeviceCannotServeIsAClearErrorAndTheLibraryWorksAfter) {
  GW_REQUIRE_GPU();
  const Tensor a = randn({64, 64}, 1, kF32Gpu);  // made before: still usable after
  try {
    (void)Tensor::empty({std::int64_t{1} << 20, std::int64_t{1} << 28}, kF32Gpu);  // 1 PiB
    ADD_FAILURE() << "expected an OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    for (const char* part : {"out of memory on cuda:0", "a tensor needed", "MiB", "free of",
                             "block cache", "Expected"}) {
      EXPECT_NE(what.find(part), std::string::npos) << "lacks \"" << part << "\": " << what;
    }
    EXPECT_EQ(e.code(), static_cast<int>(cudaErrorMemoryAllocation));
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error must not linger for later launches";
  const Tensor b = matmul(a, a);
  EXPECT_LT(testing::rel_error(b.to(Device::cpu()), matmul(a.to(Device::cpu()), a.to(Device::cpu()))),
            1e-5);
}

// Takes every block of device memory cudaMalloc can still give (largest first), so that the
// next allocation fails; frees it all when destroyed.
class MemoryHog {
 public:
  MemoryHog() {
    for (std::size_t chunk : {std::size_t{1} << 30, std::size_t{64} << 20, std::size_t{2} << 20}) {
      for (;;) {
        void* p = nullptr;
        if (cudaMalloc(&p, chunk) != cudaSuccess) {
          (void)cudaGetLastError();
          break;
        }
        blocks_.push_back(p);
      }
    }
  }
  ~MemoryHog() {
    for (void* p : blocks_) (void)cudaFree(p);
  }
  std::size_t blocks() const { return blocks_.size(); }

 private:
  std::vector<void*> blocks_;
};

struct Net {  // two 2048-wide layers: the backward's intermediates are 4 MiB each
  Tensor w1 = mul(randn({2048, 2048}, 1, kF32Gpu), 0.02).detach().set_requires_grad(true);
  Tensor w2 = mul(randn({2048, 2048}, 2, kF32Gpu), 0.02).detach().set_requires_grad(true);
  Tensor loss(const Tensor& x, const Tensor& t) const {
    return mse_loss(linear(linear(x, w1, {}, Activation::kRelu), w2), t);
  }
};

TEST(CudaOutOfMemory, OutOfMemoryWhileCapturingAbandonsTheCaptureAndTheNextStepsAreCorrect) {
  GW_REQUIRE_GPU();
  const Tensor x = randn({512, 2048}, 3, kF32Gpu), t = randn({512, 2048}, 4, kF32Gpu);
  const Tensor x2 = randn({1024, 2048}, 5, kF32Gpu), t2 = randn({1024, 2048}, 6, kF32Gpu);
  Net graphed, eager;
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);  // the same addresses every step: replays, not updates
  auto graphed_step = [&](const Tensor& in, const Tensor& target) {
    StepScope scope(arena);
    bw.backward(graphed.loss(in, target), GradWrite::kOverwrite);
    arena.record_step_end(current_stream(kGpu));
  };
  for (int step = 0; step < 3; ++step) graphed_step(x, t);  // warm-up, capture, replay at 512
  ASSERT_EQ(bw.stats().counters.captures, 1u);
  const std::vector<float> w1_grad = graphed.w1.grad().to_vector<float>();
  {
    // A new batch size is a new graph: its capture needs new blocks for its intermediates (8 MiB
    // each), and the hog leaves less than 2 MiB. The forward's memory is taken before the hog;
    // nothing else allocates before the capture (the seed and the .grads exist).
    StepScope scope(arena);
    const Tensor loss = graphed.loss(x2, t2);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    MemoryHog hog;
    ASSERT_GT(hog.blocks(), 0u);
    try {
      bw.backward(loss, GradWrite::kOverwrite);
      ADD_FAILURE() << "expected an OutOfMemoryError while capturing";
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      for (const char* part : {"out of memory on cuda:0", "graph's memory pool", "while capturing",
                               "the backward graph", "abandoned", "empty_cache"}) {
        EXPECT_NE(what.find(part), std::string::npos) << "lacks \"" << part << "\": " << what;
      }
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(current_stream(kGpu), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone) << "a capture was left open";
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(bw.stats().cached_graphs, 1u) << "nothing of the abandoned capture may be cached";
  EXPECT_EQ(graphed.w1.grad().to_vector<float>(), w1_grad) << "the abandoned capture wrote a .grad";
  // The next steps capture and replay at 1024, and give the eager backward's gradients.
  for (int step = 0; step < 3; ++step) {
    graphed_step(x2, t2);
    backward(eager.loss(x2, t2), {.grad_write = GradWrite::kOverwrite});
  }
  EXPECT_EQ(bw.stats().counters.captures, 2u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, 2u + 3u);
  EXPECT_EQ(graphed.w1.grad().to_vector<float>(), eager.w1.grad().to_vector<float>());
  EXPECT_EQ(graphed.w2.grad().to_vector<float>(), eager.w2.grad().to_vector<float>());
}

// Note [A failed backward] on the device: an eager backward that runs out of memory part-way
// throws OutOfMemoryError saying where and what it freed, undefines the .grads it made, joins its
// streams and leaves no CUDA error behind; with the memory back, a new forward and backward give
// the gradients of an undisturbed backward.
TEST(CudaOutOfMemory, AnEagerBackwardThatRunsOutPartWaySaysWhatItLeftAndUndoesItsNewGrads) {
  GW_REQUIRE_GPU();
  const Tensor x = randn({512, 2048}, 3, kF32Gpu), t = randn({512, 2048}, 4, kF32Gpu);
  Net reference, net;
  backward(reference.loss(x, t));
  {
    const Tensor loss = net.loss(x, t);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    empty_cache(kGpu);
    MemoryHog hog;
    ASSERT_GT(hog.blocks(), 0u);
    try {
      backward(loss);
      ADD_FAILURE() << "expected an OutOfMemoryError";
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      for (const char* part : {"out of memory on cuda:0", "[the backward failed at step"}) {
        EXPECT_NE(what.find(part), std::string::npos) << "lacks \"" << part << "\": " << what;
      }
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_FALSE(net.w1.grad().defined());
    EXPECT_FALSE(net.w2.grad().defined());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  backward(net.loss(x, t));
  EXPECT_EQ(net.w1.grad().to_vector<float>(), reference.w1.grad().to_vector<float>());
  EXPECT_EQ(net.w2.grad().to_vector<float>(), reference.w2.grad().to_vector<float>());
}

// y = x; its backward first launches a kernel that traps when *flag is not zero.
Tensor faulty(const Tensor& x, const Tensor& flag) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = mul(x, 1.0);
  }
  if (autograd_detail::needs_grad({&x})) {
    autograd_detail::record(
        "faulty", y, {&x}, {},
        [flag](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
          testing::launch_trap_if_set(static_cast<const float*>(flag.raw_data()),
                                      current_stream(g.device()));
          if (grads[0].tensor) scale_backward(g, 1.0, grads[0]);
        });
  }
  return y;
}

// Trains a small model whose backward faults at step 3 (a BackwardGraph: warm-up, capture, replay,
// then the faulting replay); prints what graphward reported and exits 0, or exits 1 if nothing
// was reported. Runs in a child process (EXPECT_EXIT).
[[noreturn]] void train_until_the_fault() {
  try {
    const Tensor flag = zeros({1}, kF32Gpu);
    const Tensor x = randn({32, 64}, 1, kF32Gpu), t = randn({32, 16}, 2, kF32Gpu);
    const Tensor w1 = mul(randn({64, 64}, 3, kF32Gpu), 0.1).detach().set_requires_grad(true);
    const Tensor w2 = mul(randn({16, 64}, 4, kF32Gpu), 0.1).detach().set_requires_grad(true);
    BackwardGraph bw(kGpu);
    for (int step = 0; step < 6; ++step) {
      if (step == 3) {
        NoGradGuard no_grad;
        copy_(flag, ones({1}, kF32Gpu));
      }
      const Tensor loss = mse_loss(linear(faulty(linear(x, w1), flag), w2), t);
      bw.backward(loss, GradWrite::kOverwrite);
      std::fprintf(stderr, "step %d: loss %g\n", step, loss.item());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "graphward reported: %s\n", e.what());
    std::exit(0);  // static destructors run after the context was lost: must not hang or crash
  }
  std::fprintf(stderr, "no error was reported\n");
  std::exit(1);
}

TEST(CudaFaults, AFaultInAReplayIsReportedWithTheGraphThatRanAndTheProcessExitsCleanly) {
  GW_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, not a fork of this one
  EXPECT_EXIT(train_until_the_fault(), ::testing::ExitedWithCode(0),
              "step 2: loss.*graphward reported: .*kernel faulted earlier.*context of this process "
              "is lost.*the backward graph captured at BackwardGraph::backward\\(\\) call [0-9]+.*"
              "faulty#.*GRAPHWARD_LOCALIZE_FAULTS=1");
}

TEST(CudaFaults, WithLocalizeFaultsTheBackwardRunsEagerlyAndNamesTheFailingNode) {
  GW_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("GRAPHWARD_LOCALIZE_FAULTS", "1", 1);  // read once, at the first backward
        train_until_the_fault();
      },
      ::testing::ExitedWithCode(0),
      "step 2: loss.*graphward reported: graphward: the backward of faulty#[0-9]+ \\(step [0-9]+ "
      "of [0-9]+ of the plan, on stream 0\\) failed: CUDA error cudaError.*context of this "
      "process is lost");
}

// ---- Note [Replay watchdog] (dist/watchdog.h) ---------------------------------------------------

// A step whose graph holds a group's all-reduce, after a kernel that spins while `flag` is set.
struct WatchedStep {
  Tensor x = randn({16, 32}, 1, kF32Gpu);
  Tensor w = mul(randn({8, 32}, 2, kF32Gpu), 0.1).detach().set_requires_grad(true);
  Sgd opt{{w}, {.lr = 0.01}};
  std::optional<StepGraph> graph{std::in_place, kGpu, std::vector<Tensor>{x}};
  volatile int* flag = nullptr;  // mapped host memory
  const volatile int* device_flag = nullptr;
  WatchedStep() {
    void* host = nullptr;
    GW_CUDA_CHECK(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped));
    flag = static_cast<volatile int*>(host);
    *flag = 0;
    void* dev = nullptr;
    GW_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    device_flag = static_cast<const volatile int*>(dev);
  }
  Tensor run(dist::ProcessGroup* pg) {
    return graph->run([this, pg] {
      testing::launch_spin_while_set(device_flag, current_stream(kGpu));
      const Tensor loss = mean(linear(x, w));
      backward(loss, {.grad_write = GradWrite::kOverwrite, .reduce_gradients = pg});
      opt.step();
      return loss;
    });
  }
};

#if GRAPHWARD_HAS_NCCL
TEST(CudaReplayWatchdog, AReplayThatDoesNotFinishAbortsItsGroupByNameAndTheNextLaunchIsRefused) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu, .collective_timeout_s = 1});
  WatchedStep step;
  for (int s = 0; s < 3; ++s) (void)step.run(&pg).item();  // warm-up, capture, a replay
  EXPECT_EQ(step.graph->counters().captures, 1u);
  EXPECT_EQ(pg.aborted(), "");
  *step.flag = 1;            // the next replay's kernel never finishes: a dead peer
  (void)step.run(&pg);       // launched; nothing on the host waits for it
  const auto start = std::chrono::steady_clock::now();
  while (pg.aborted().empty() &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string why = pg.aborted();
  // The capturing step's launch was replay 1, the next step's 2: the stuck one is 3.
  EXPECT_NE(why.find("rank 0: replay 3 of the whole-step graph of a StepGraph"), std::string::npos)
      << why;
  EXPECT_NE(why.find("did not finish within 1 s"), std::string::npos) << why;
  EXPECT_LT(waited, 5.0) << "the group was marked aborted late: " << why;
  // The next launch is refused by name, before anything is launched; so is the group's next call.
  GW_EXPECT_ERROR((void)step.run(&pg), "rank 0: replay 4 of the whole-step graph", "refused",
                  "the group was aborted", "did not finish within 1 s");
  GW_EXPECT_ERROR(pg.all_reduce_average({step.w}), "the group was aborted");
  *step.flag = 0;  // let the spinning kernel end (the process exits cleanly)
}

TEST(CudaReplayWatchdog, AGraphThatOutlivesItsGroupRefusesToLaunch) {
  GW_REQUIRE_GPU();
  WatchedStep step;
  {
    dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu});
    for (int s = 0; s < 3; ++s) (void)step.run(&pg).item();
    EXPECT_EQ(step.graph->counters().replays, 2u);
  }
  GW_EXPECT_ERROR((void)step.run(nullptr), "holds collectives of a ProcessGroup that is gone");
  // A graph captured without a group is not watched: the same step captured again runs.
  step.graph->recapture();
  for (int s = 0; s < 2; ++s) (void)step.run(nullptr).item();
}
#endif

}  // namespace
}  // namespace graphward
