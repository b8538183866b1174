// PyTorch's stream and CUDA-graph semantics where graphward claims them, as its own tests of
// torch.cuda.graph and streams pin them (test_cuda.py): a graph's memory once the graph is gone,
// memory read through an offset view on another stream, timing events recorded inside a captured
// step.
#include <cmath>

#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaPyTorchSemantics : public testing::PoisonedCudaTest {};

// A StepGraph destroyed while a tensor its step made lives (an output the caller kept) gives its
// pool back but for that tensor's block; the block goes with the tensor (the whole pool stayed
// while one output lived: 0 of 194 MiB back with a 64 MiB output kept). As PyTorch keeps only a
// live output's block of a graph's private pool. Counted by the process's graph pools
// (debug::graph_pool_bytes), not the device's free memory, which the suite's other processes move.
TEST_F(CudaPyTorchSemantics, AGraphsMemoryIsGivenBackWhenItGoesButForTheOutputsStillAlive) {
  const Tensor w = mul(randn({1024, 1024}, 1, kF32Gpu), 0.02).detach().set_requires_grad(true);
  const Tensor x = randn({2048, 1024}, 2, kF32Gpu);
  Sgd opt({w}, {.lr = 1e-3});
  Tensor kept;
  auto body = [&] {
    const Tensor h = gelu(linear(linear(x, w), w));  // 32 MiB activations each
    kept = mul(h, 1.0);                              // an output the caller keeps (32 MiB)
    const Tensor loss = mean(h);
    backward(loss, {.grad_write = GradWrite::kOverwrite});
    opt.step();
    return loss;
  };
  const std::size_t before = debug::graph_pool_bytes();
  std::size_t pool = 0;
  {
    StepGraph step(kGpu);
    (void)step.run(body);  // eager warm-up
    (void)step.run(body);  // captured: its memory from the graph's pool
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    pool = debug::graph_pool_bytes() - before;
    ASSERT_GT(pool, std::size_t{24} << 20) << "the capture took its pool";
  }
  ASSERT_TRUE(kept.defined());
  const std::size_t held = debug::graph_pool_bytes() - before;
  EXPECT_GE(held, kept.nbytes()) << "the kept output's block was freed under it";
  EXPECT_LE(held, kept.nbytes() + (std::size_t{2} << 20))
      << "pool " << pool << " bytes; still held " << held << " for a " << kept.nbytes()
      << "-byte output";
  const std::vector<float> v = kept.to_vector<float>();  // still readable
  EXPECT_TRUE(std::isfinite(v[0]) && std::isfinite(v.back()));
  kept = Tensor();
  EXPECT_EQ(debug::graph_pool_bytes(), before) << "the output's block went with it";
}

// A view at an offset into a tensor's memory (Storage::borrow over its storage), read on another
// stream that is held back: its owner's memory is not reused before that read ran (it went back
// to the block cache at once and was overwritten first: a read of freed memory).
TEST_F(CudaPyTorchSemantics, AnOffsetViewReadOnAnotherStreamHoldsBackItsOwnersFree) {
  Stream reader(kGpu);
  constexpr std::int64_t n = 1 << 20;
  Tensor out;
  {
    Tensor owner = full({2 * n}, 3.0, kF32Gpu);
    const cudaStream_t s = current_stream(kGpu);
    char* data = static_cast<char*>(owner.raw_data()) + n * sizeof(float);
    Tensor view = Tensor::from_storage(
        Storage::borrow(kGpu, data, n * sizeof(float), s, owner.storage()), {n}, DType::kFloat32);
    {
      StreamGuard on(reader);
      testing::stall(reader.get(), 100);
      NoGradGuard no_grad;
      out = mul(view, 1.0);  // reads the view on the reader stream, after the hold
    }
    view = Tensor();
    owner = Tensor();
  }
  // The same size on the caller's stream again: the cache would hand the owner's block back.
  const Tensor reuse = full({2 * n}, -1.0, kF32Gpu);
  const std::vector<float> got = out.to_vector<float>();
  for (std::int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], 3.f) << "element " << i;
  EXPECT_EQ(reuse.to_vector<float>()[0], -1.f);
}

// Timing events recorded inside a StepGraph's step (Event::record_external, as
// torch.cuda.Event(enable_timing=True).record() inside torch.cuda.graph): the eager warm-up
// records them plainly (it threw cudaErrorIllegalState), the capture makes them nodes, and every
// replay's elapsed time can be read.
TEST_F(CudaPyTorchSemantics, TimingEventsRecordedInsideAStepWorkEagerCapturedAndReplayed) {
  const Tensor w = mul(randn({256, 256}, 3, kF32Gpu), 0.05).detach().set_requires_grad(true);
  const Tensor x = randn({128, 256}, 4, kF32Gpu);
  Sgd opt({w}, {.lr = 1e-3});
  Event start(kGpu, true), stop(kGpu, true);
  StepGraph step(kGpu);
  for (int s = 0; s < 4; ++s) {
    (void)step.run([&] {
      start.record_external(current_stream(kGpu));
      const Tensor loss = mean(gelu(linear(x, w)));
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      stop.record_external(current_stream(kGpu));
      return loss;
    });
    stop.synchronize();
    const float ms = stop.elapsed_ms_since(start);
    EXPECT_GT(ms, 0.f) << "step " << s;
    EXPECT_LT(ms, 1000.f) << "step " << s;
  }
  EXPECT_EQ(step.counters().captures, 1u);
  EXPECT_GE(step.counters().replays, 3u);
}

}  // namespace
}  // namespace graphward
