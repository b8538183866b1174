// Note [Step arena] on the GPU: the same device addresses every step, a kept tensor never
// overwritten, and cross-step reuse ordered after every stream that used a slot — each race test
// keeps the other stream busy behind a GEMM chain, so a missing wait reads scribbled memory.
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
constexpr TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaStepArena : public testing::PoisonedCudaTest {};

using testing::busy_work;

TEST_F(CudaStepArena, EveryStepGetsTheSameDeviceAddressesAndTheSameGradients) {
  const Tensor w = randn({64, 64}, 1, kF32Gpu).set_requires_grad(true);
  w.grad() = zeros({64, 64}, kF32Gpu);  // persistent, made outside the steps
  const Tensor x = randn({32, 64}, 2, kF32Gpu);
  StepArena arena(kGpu);
  std::vector<const void*> first;
  std::vector<float> first_grad;
  for (int s = 0; s < 4; ++s) {
    std::vector<const void*> ptrs;
    {
      StepScope step(arena);
      const Tensor h = relu(matmul(x, w));
      const Tensor loss = mean(mul(h, h));
      ptrs = {h.raw_data(), loss.raw_data()};
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      arena.record_step_end(current_stream(kGpu));
    }
    if (s == 0) {
      first = ptrs;
      first_grad = w.grad().to_vector<float>();
    } else {
      EXPECT_EQ(ptrs, first) << "step " << s;
      EXPECT_EQ(w.grad().to_vector<float>(), first_grad) << "step " << s;
    }
  }
  EXPECT_EQ(arena.stats().rerecords, 0u);
  EXPECT_GT(arena.stats().served, 0u);
}

TEST_F(CudaStepArena, ASlotReadOnAnotherStreamIsReusedOnlyAfterThatStreamIsDone) {
  // Step 1 makes `t` on `home` and reads it on `reader` behind a GEMM chain; `t` dies at the end
  // of the step while the read is still queued. Step 2 gets t's slot on `home` and scribbles on it
  // at once: correct only if the slot waited for `reader`.
  Stream home(kGpu), reader(kGpu);
  StepArena arena(kGpu);
  const Shape shape{1024, 1024};
  Tensor seen, expected;
  const void* slot_ptr = nullptr;
  {
    StepScope step(arena);
    Tensor t;
    {
      StreamGuard g(home);
      t = randn(shape, 3, kF32Gpu);
      slot_ptr = t.raw_data();
    }
    expected = relu(t.to(Device::cpu())).to(kGpu);
    StreamGuard g(reader);
    const Tensor keep_busy = busy_work();
    seen = relu(t);
  }
  {
    StepScope step(arena);
    StreamGuard g(home);
    const Tensor scribble = full(shape, -5.0, kF32Gpu);
    EXPECT_EQ(scribble.raw_data(), slot_ptr) << "expected t's slot back";
  }
  EXPECT_EQ(seen.to_vector<float>(), expected.to_vector<float>());
}

TEST_F(CudaStepArena, SlotsAreReusedOnlyAfterThePreviousStepsEnd) {
  // The previous step's end is recorded on `caller` behind a GEMM chain (standing in for a replayed
  // backward that still reads the step's memory); the next step's forward on `fwd` must wait for
  // it before it rewrites the slot.
  Stream caller(kGpu), fwd(kGpu);
  StepArena arena(kGpu);
  const Shape shape{1024, 1024};
  Tensor seen;
  {
    StepScope step(arena);
    Tensor a;
    {
      StreamGuard g(fwd);
      a = full(shape, 2.0, kF32Gpu);
    }
    StreamGuard g(caller);
    const Tensor keep_busy = busy_work();
    seen = mul(a, 3.0);  // reads a on `caller`, after the chain
    arena.record_step_end(caller.get());
  }
  {
    StepScope step(arena);
    StreamGuard g(fwd);
    const Tensor scribble = full(shape, -1.0, kF32Gpu);
  }
  EXPECT_EQ(seen.to_vector<float>(), std::vector<float>(1024 * 1024, 6.0f));
}

}  // namespace
}  // namespace graphward

namespace graphward {
namespace {

// Note [Graph memory pool]: inside a capture, allocations come from the pool (no memory nodes in
// the graph); a block used on its own capture stream only is reused by the next allocation of its
// size there, a block another stream read is not; outside the capture nothing comes from the pool.
TEST(CudaGraphMemoryPool, ServesACaptureAndReusesOnlyWhatStreamOrderAllows) {
  GW_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const TensorOptions f32{DType::kFloat32, gpu};
  Stream s(gpu), t(gpu);
  Tensor src;
  {
    StreamGuard on(s);
    src = randn({256}, 1, f32);  // made on s: read there with no wait
  }
  Event fork(gpu), join(gpu);
  GraphMemoryPool pool(gpu);
  {
    const Tensor outside = zeros({256}, f32);  // not captured: not the pool's
    (void)outside;
  }
  EXPECT_EQ(pool.bytes(), 0u);
  cudaGraph_t graph = nullptr;
  const void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  {
    StreamGuard on(s);
    ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    {
      GraphPoolScope scope(pool);
      {
        const Tensor x = mul(src, 2.0);  // used on s only
        a = x.raw_data();
      }
      {
        const Tensor y = mul(src, 3.0);  // the same size on s: x's block again
        b = y.raw_data();
        // y is read on t (forked from s inside the capture): its block is not reused.
        fork.record(s.get());
        fork.block(t.get());
        {
          StreamGuard on_t(t);
          const Tensor z = mul(y, 1.0);
          d = z.raw_data();
        }
        join.record(t.get());
        join.block(s.get());
      }
      const Tensor w = mul(src, 4.0);  // not y's block
      c = w.raw_data();
    }
    ASSERT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(c, b);
  EXPECT_NE(d, b);
  EXPECT_EQ(pool.blocks(), 3u);  // x/y, z, w
  std::size_t n = 0, mem_nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    if (type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree) ++mem_nodes;
  }
  EXPECT_EQ(mem_nodes, 0u);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // The same work captured again with the pool (an update) takes the pool's blocks: no new ones.
  const std::size_t bytes = pool.bytes();
  {
    StreamGuard on(s);
    ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    {
      GraphPoolScope scope(pool);
      const Tensor x = mul(src, 2.0);
      const Tensor y = mul(src, 3.0);
      const Tensor w = mul(src, 4.0);
    }
    ASSERT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
  }
  EXPECT_EQ(pool.bytes(), bytes);
  EXPECT_EQ(pool.blocks(), 3u);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

}  // namespace
}  // namespace graphward
