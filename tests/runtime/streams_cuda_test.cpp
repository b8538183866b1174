// Streams, events and the stream rules of docs/DESIGN.md that the foundation owns: the current
// stream (rule [current stream]), automatic waits for tensors produced on another stream (rule
// [read after write]) and stream-safe reuse of freed memory (rule [reuse after use]). Each race
// test is built to fail when its wait is missing: the producer or the other user is kept busy by a
// long GEMM chain, and new memory is poisoned with NaN.
#include <cstdint>
#include <functional>
#include <optional>

#include "graphward/capture/stream_capture.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
constexpr TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaStreams : public testing::PoisonedCudaTest {};

using testing::busy_work;

TEST_F(CudaStreams, CurrentStreamDefaultsToANonBlockingGraphwardStream) {
  cudaStream_t s = current_stream(kGpu);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(s, cudaStreamLegacy);
  EXPECT_EQ(s, default_stream(kGpu));
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(s, &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
}

TEST_F(CudaStreams, GuardSetsAndRestoresTheCurrentStreamAndOpsUseIt) {
  Stream a(kGpu), b(kGpu);
  const cudaStream_t outer = current_stream(kGpu);
  {
    StreamGuard ga(a);
    EXPECT_EQ(current_stream(kGpu), a.get());
    const Tensor t = ones({4}, kF32Gpu);
    EXPECT_EQ(t.storage()->producer_stream(), a.get());
    {
      StreamGuard gb(b);
      EXPECT_EQ(current_stream(kGpu), b.get());
      const Tensor u = relu(t);  // rule [current stream]: runs on the current stream
      EXPECT_EQ(u.storage()->producer_stream(), b.get());
    }
    EXPECT_EQ(current_stream(kGpu), a.get());
  }
  EXPECT_EQ(current_stream(kGpu), outer);
}

TEST_F(CudaStreams, LegacyAndPerThreadDefaultStreamsAreRefused) {
  GW_EXPECT_ERROR(StreamGuard(kGpu, nullptr), "legacy default stream");
  GW_EXPECT_ERROR(StreamGuard(kGpu, cudaStreamLegacy), "legacy default stream");
  GW_EXPECT_ERROR(StreamGuard(kGpu, cudaStreamPerThread), "cudaStreamPerThread");
  EXPECT_EQ(current_stream(kGpu), default_stream(kGpu));
}

TEST_F(CudaStreams, ConsumerOnAnotherStreamWaitsForTheProducer) {  // rule [read after write]
  Stream producer(kGpu), consumer(kGpu);
  Tensor y, expected;
  {
    StreamGuard g(producer);
    y = busy_work();
  }
  Tensor z;
  {
    StreamGuard g(consumer);
    z = relu(y);  // must wait for the GEMM chain on `producer`
  }
  {
    StreamGuard g(producer);
    expected = relu(y);  // same stream as y: ordered without any event
  }
  EXPECT_EQ(z.to_vector<float>(), expected.to_vector<float>());
}

// Rule [read after write] once a write: a stream that waited for a tensor's producer reads it again
// without a new wait (a branch reading a parameter at every step), but a new write on the
// producer's stream, queued behind a long GEMM chain, is waited for again: the second read sees the
// new contents.
TEST_F(CudaStreams, AReaderWaitsAgainForEveryNewWriteOfTheProducer) {
  Stream producer(kGpu), reader(kGpu);
  const Shape shape{1024, 1024};
  Tensor t;
  {
    StreamGuard g(producer);
    t = full(shape, 1.0, kF32Gpu);
  }
  Tensor first, again, after_write;
  {
    StreamGuard g(reader);
    first = mul(t, 2.0);
    again = mul(t, 2.0);  // the same write: no new wait needed
  }
  {
    StreamGuard g(producer);
    NoGradGuard no_grad;
    const Tensor keep_busy = busy_work();
    copy_(t, full(shape, 5.0, kF32Gpu));  // a new write, behind the chain
  }
  {
    StreamGuard g(reader);
    after_write = mul(t, 2.0);  // must wait for the new write
  }
  EXPECT_EQ(first.to_vector<float>(), std::vector<float>(1024 * 1024, 2.0f));
  EXPECT_EQ(again.to_vector<float>(), std::vector<float>(1024 * 1024, 2.0f));
  EXPECT_EQ(after_write.to_vector<float>(), std::vector<float>(1024 * 1024, 10.0f));
}

TEST_F(CudaStreams, InPlaceWriteOnAnotherStreamWaitsForTheProducer) {
  Stream producer(kGpu), writer(kGpu);
  Tensor g, y, dy, expected;
  {
    StreamGuard s(producer);
    const Tensor w = busy_work(4);
    g = mul(w, 1.0);  // produced after the chain
    y = relu(w);
    dy = ones(w.shape(), kF32Gpu);
    Tensor tmp;
    relu_backward(dy, y, {&tmp});
    expected = add(g, tmp);
  }
  {
    StreamGuard s(writer);
    relu_backward(dy, y, {&g, /*accumulate=*/true});  // g += ...: waits for g's producer
  }
  EXPECT_EQ(g.to_vector<float>(), expected.to_vector<float>());
}

// A write on another stream waits for the producer's own reads too — also when that stream
// already waited for the producer's write (it read the tensor before): the event it waited for then
// was recorded before the producer's later reads. Two kinds of in-place write: a copy, and an
// accumulation into the tensor.
TEST_F(CudaStreams, AWriteOnAnotherStreamWaitsForTheProducersLaterReads) {
  const Shape shape{1024, 1024};
  const std::size_t n = 1024 * 1024;
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "copy_" : "accumulate");
    Stream home(kGpu), branch(kGpu);
    Tensor w;
    {
      StreamGuard g(home);
      w = full(shape, 1.0, kF32Gpu);
    }
    Tensor early, late, source;
    {
      StreamGuard g(branch);
      early = mul(w, 2.0);  // waits for w's write
      source = full(shape, 7.0, kF32Gpu);
    }
    {
      StreamGuard g(home);
      testing::stall(home.get(), 200);
      late = mul(w, 3.0);  // the producer's own read, behind the stall
    }
    {
      StreamGuard g(branch);
      NoGradGuard no_grad;
      if (kind == 0) {
        copy_(w, source);  // must wait for `late`'s read
      } else {
        relu_backward(source, source, {&w, /*accumulate=*/true});  // w += 7, likewise
      }
    }
    EXPECT_EQ(early.to_vector<float>(), std::vector<float>(n, 2.0f));
    EXPECT_EQ(late.to_vector<float>(), std::vector<float>(n, 3.0f));
    EXPECT_EQ(w.to_vector<float>(), std::vector<float>(n, kind == 0 ? 7.0f : 8.0f));
  }
}

TEST_F(CudaStreams,
       FreedMemoryIsNotReusedWhileAnotherStreamStillReadsIt) {  // rule [reuse after use]
  Stream home(kGpu), reader(kGpu);
  const Shape shape{2048, 2048};
  Tensor t, expected;
  {
    StreamGuard g(home);
    t = randn(shape, 3, kF32Gpu);
    expected = relu(t);
  }
  Tensor seen;
  {
    StreamGuard g(reader);
    const Tensor keep_busy = busy_work();  // the read below starts only after this chain
    seen = relu(t);
  }
  {
    StreamGuard g(home);
    t = Tensor();  // free on `home` while `reader` has not read it yet
    for (int i = 0; i < 4; ++i) {
      const Tensor scribble = full(shape, -123.0, kF32Gpu);  // would land in t's block
    }
  }
  EXPECT_EQ(seen.to_vector<float>(), expected.to_vector<float>());
}

// ---- the block cache (Note [Block cache]) -------------------------------------------------------

TEST_F(CudaStreams, BlocksUsedOnOneStreamAreReusedFromTheCacheOnThatStreamOnly) {
  Stream s(kGpu), other(kGpu);
  empty_cache(kGpu);
  ASSERT_EQ(cached_bytes(kGpu), 0u);
  StreamGuard g(s);
  void* block = nullptr;
  {
    const Tensor a = full({1000}, 1.0, kF32Gpu);  // 4000 bytes: a 4096-byte block
    block = a.raw_data();
  }
  EXPECT_EQ(cached_bytes(kGpu), 4096u);
  {
    StreamGuard on_other(other);  // another stream never takes it
    const Tensor b = full({1000}, 2.0, kF32Gpu);
    EXPECT_NE(b.raw_data(), block);
    EXPECT_EQ(cached_bytes(kGpu), 4096u);
  }
  const Tensor c = full({1000}, 3.0, kF32Gpu);  // same stream, same size: the cached block
  EXPECT_EQ(c.raw_data(), block);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(1000, 3.0f));
  empty_cache(kGpu);
  EXPECT_EQ(cached_bytes(kGpu), 0u);
}

TEST_F(CudaStreams, ReusedBlocksFollowTheStreamOrderOfTheirEarlierUses) {
  // A reader enqueued behind a long GEMM chain on the same stream still sees the old contents:
  // the block is rewritten only after it, in stream order.
  Stream s(kGpu);
  StreamGuard g(s);
  const Shape shape{1024, 1024};
  Tensor seen;
  void* block = nullptr;
  {
    const Tensor a = full(shape, 1.0, kF32Gpu);
    block = a.raw_data();
    const Tensor keep_busy = busy_work();
    seen = mul(a, 2.0);
  }
  const Tensor scribble = full(shape, -7.0, kF32Gpu);
  EXPECT_EQ(scribble.raw_data(), block) << "expected the freed block back from the cache";
  EXPECT_EQ(seen.to_vector<float>(), std::vector<float>(1024 * 1024, 2.0f));
}

// Memory read on another stream goes to the cache too, once its own stream waits for that one
// (rule [reuse after use], then Note [Block cache]): reused on its stream, the block is rewritten
// only after the other stream's reader — enqueued behind a long GEMM chain — has read the old
// contents.
TEST_F(CudaStreams, MemoryUsedOnAnotherStreamIsCachedAfterItsStreamWaitsForTheOther) {
  Stream home(kGpu), reader(kGpu);
  empty_cache(kGpu);
  const Shape shape{1024, 1024};
  Tensor seen;
  void* block = nullptr;
  {
    Tensor t;
    {
      StreamGuard g(home);
      t = full(shape, 1.0, kF32Gpu);
      block = t.raw_data();
    }
    StreamGuard g(reader);
    const Tensor keep_busy = busy_work();
    seen = mul(t, 2.0);  // read on `reader`, behind the GEMMs
  }
  EXPECT_GE(cached_bytes(kGpu), 4u * 1024 * 1024);
  {
    StreamGuard g(home);
    const Tensor scribble = full(shape, -7.0, kF32Gpu);
    EXPECT_EQ(scribble.raw_data(), block) << "expected the freed block back from the cache";
  }
  EXPECT_EQ(seen.to_vector<float>(), std::vector<float>(1024 * 1024, 2.0f));
}

// Note [Frees at the join] (engine/runtime/memory.h): an eager backward on two streams gives the memory
// both streams used — the branch's output, which the loss read on the caller's stream, and its
// gradient, which the branch read — back to the cache after its join, each block on its own stream.
// The branch is stalled, so its backward reads late: reused and rewritten at once on both streams,
// the blocks must still hold what the backward read (the weight's gradient equals the one-stream
// backward's, bitwise), and the branch's block is reused on the branch.
// Moved onto the caller's stream (Note [Streams of an eager backward], engine/backward/backward_plan.h),
// the backward reads the branch's output on the caller's stream, which is the one stalled then:
// the branch must not rewrite the block before the caller's stream is done with it.
enum class Run { kOneStream, kJoined, kMoved };

std::vector<float> grad_of_w_after_reuse(Run run) {
  Stream home(kGpu), branch(kGpu);
  StreamGuard on_home(home);
  const Shape shape{256, 256};
  const Tensor x = randn(shape, 11, kF32Gpu);
  const Tensor w = randn(shape, 12, kF32Gpu).set_requires_grad(true);
  void* out_block = nullptr;
  Tensor loss;
  {
    Tensor h;
    {
      std::optional<StreamGuard> on_branch;
      if (run != Run::kOneStream) on_branch.emplace(branch);
      h = relu(matmul(x, w));
    }
    out_block = h.raw_data();
    loss = sum(mul(h, h));  // reads h on the caller's stream
  }
  if (run == Run::kJoined) testing::stall(branch.get(), 200);
  if (run == Run::kMoved) testing::stall(home.get(), 200);
  std::vector<StepTiming> trace;
  // Frees h and its gradient.
  backward(loss, {.timings = run == Run::kMoved ? &trace : nullptr,
                  .streams = run == Run::kJoined ? EagerStreams::kForward : EagerStreams::kAuto});
  if (run == Run::kMoved) {
    for (const StepTiming& t : trace) EXPECT_EQ(t.stream, 0) << "expected a moved backward";
  }
  if (run != Run::kOneStream) {
    std::vector<Tensor> scribbles;
    bool reused = false;
    for (int i = 0; i < 4; ++i) {
      scribbles.push_back(full(shape, -9.0, kF32Gpu));  // on the caller's stream
      StreamGuard on_branch(branch);
      scribbles.push_back(full(shape, -7.0, kF32Gpu));
      reused = reused || scribbles.back().raw_data() == out_block;
    }
    EXPECT_TRUE(reused) << "expected the branch output's block back from the branch's cache";
  }
  return w.grad().to_vector<float>();
}

TEST_F(CudaStreams, MemoryAnEagerBackwardUsedOnTwoStreamsIsReusedOnlyAfterItsJoin) {
  EXPECT_EQ(grad_of_w_after_reuse(Run::kJoined), grad_of_w_after_reuse(Run::kOneStream));
}

TEST_F(CudaStreams, MemoryABackwardMovedToTheCallersStreamReadIsReusedOnlyAfterIt) {
  EXPECT_EQ(grad_of_w_after_reuse(Run::kMoved), grad_of_w_after_reuse(Run::kOneStream));
}

TEST_F(CudaStreams, MemoryOfARawStreamIsNotCached) {
  empty_cache(kGpu);
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  {
    StreamGuard g(kGpu, raw);
    const Tensor r = full({4096}, 1.0, kF32Gpu);
  }
  EXPECT_EQ(cached_bytes(kGpu), 0u) << "a raw stream's handle may be destroyed and reused";
  ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

TEST_F(CudaStreams, CacheLimitBoundsWhatIsKept) {
  Stream s(kGpu);
  StreamGuard g(s);
  empty_cache(kGpu);
  const std::size_t limit = block_cache_limit();
  set_block_cache_limit(0);
  { const Tensor a = full({1000}, 1.0, kF32Gpu); }
  EXPECT_EQ(cached_bytes(kGpu), 0u);
  set_block_cache_limit(8192);
  {
    const Tensor a = full({1000}, 1.0, kF32Gpu), b = full({1000}, 1.0, kF32Gpu),
                 c = full({1000}, 1.0, kF32Gpu);
  }
  EXPECT_EQ(cached_bytes(kGpu), 8192u);  // two 4096-byte blocks fit, the third went to the pool
  set_block_cache_limit(limit);
  empty_cache(kGpu);
  EXPECT_EQ(cached_bytes(kGpu), 0u);
}

TEST_F(CudaStreams, GemmsOnTwoStreamsAtOnceUseSeparateWorkspaces) {
  Stream s1(kGpu), s2(kGpu);
  const Tensor a = randn({1024, 1024}, 1, kF32Gpu), b = randn({1024, 1024}, 2, kF32Gpu);
  Tensor ref = matmul(a, b);
  std::vector<Tensor> outs;
  for (int i = 0; i < 8; ++i) {
    StreamGuard g(i % 2 ? s1 : s2);
    outs.push_back(matmul(a, b));
  }
  const std::vector<float> r = ref.to_vector<float>();
  for (const Tensor& o : outs)
    EXPECT_LT(testing::rel_error(testing::values(o), testing::values(ref)), 1e-6);
}

TEST_F(CudaStreams, EventsTimeWork) {
  Stream s(kGpu);
  Event start(kGpu, true), stop(kGpu, true);
  StreamGuard g(s);
  start.record(s.get());
  const Tensor y = busy_work(2);
  stop.record(s.get());
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GT(stop.elapsed_ms_since(start), 0.0f);
}

TEST_F(CudaStreams, TensorsMayOutliveTheStreamTheyWereMadeOn) {
  // Note [Stream lifetime]: a Stream's CUDA stream goes back to a pool, so freeing (and reading)
  // memory that was allocated on it stays valid after the Stream object is gone.
  Tensor kept, expected;
  {
    Stream s(kGpu);
    StreamGuard g(s);
    kept = busy_work(2);
    expected = relu(kept);
    Tensor scratch = matmul(kept, kept);  // freed inside the scope, on s
  }
  EXPECT_EQ(relu(kept).to_vector<float>(), expected.to_vector<float>());
  kept = Tensor();     // freed on the pooled stream
  Stream again(kGpu);  // may reuse that stream
  StreamGuard g(again);
  EXPECT_EQ(sum(ones({1000}, kF32Gpu)).item(), 1000.0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaStreams, StreamsAndEventsAreMoveOnlyOwners) {
  Stream a(kGpu);
  const cudaStream_t raw = a.get();
  Stream b = std::move(a);
  EXPECT_EQ(b.get(), raw);
  EXPECT_EQ(a.get(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is defined
  Event e(kGpu);
  Event f = std::move(e);
  EXPECT_FALSE(e.valid());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(f.valid());
  static_assert(!std::is_copy_constructible_v<Stream> && !std::is_copy_constructible_v<Event>);
}

// Note [Frees during a capture]: an eager tensor whose last handle dies while its stream is being
// captured (the previous step's tape, dropped inside a captured step) adds nothing to the graph
// — a free node would only take graph allocations, and the block would leak — and its block is
// released once the capture has ended: into the cache when it was used on its own stream only,
// else to the pool after rule [reuse after use]'s waits.
TEST_F(CudaStreams, ATensorDroppedInsideACaptureIsReleasedAfterItAndAddsNoNode) {
  Stream s(kGpu);
  StreamGuard g(s);
  empty_cache(kGpu);
  std::optional<Tensor> eager = full({1000}, 1.0, kF32Gpu);  // a 4096-byte block, made eagerly
  void* block = eager->raw_data();
  cudaGraph_t graph = capture::capture_stream(s.get(), "test", "", [&] {
    eager.reset();
    EXPECT_EQ(cached_bytes(kGpu), 0u) << "released while its stream is still being captured";
  });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(capture::count_nodes(graph).nodes.size(), 0u);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cached_bytes(kGpu), 4096u) << "expected the block in the cache after the capture";
  const Tensor again = full({1000}, 2.0, kF32Gpu);
  EXPECT_EQ(again.raw_data(), block);
  EXPECT_EQ(again.to_vector<float>(), std::vector<float>(1000, 2.0f));
}

// ... while memory allocated inside the capture (an allocation node's) and dropped there is freed
// there: a free node, as CUDA requires, not a deferred release after the graph is gone.
TEST_F(CudaStreams, ATensorMadeAndDroppedInsideACaptureIsAnAllocationAndAFreeNode) {
  Stream s(kGpu);
  StreamGuard g(s);
  cudaGraph_t graph = capture::capture_stream(
      s.get(), "test", "", [&] { const Tensor inside = full({1000}, 1.0, kF32Gpu); });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const capture::NodeCounts counts = capture::count_nodes(graph);
  EXPECT_EQ(counts.memory, 2u) << "expected one allocation and one free node";
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(detail::release_deferred_storage(), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Note [Node priorities] (capture/stream_capture.h): a kernel captured on a stream of higher
// priority keeps it in the graph, and such a graph is instantiated with per-node priorities; a
// graph of default-priority kernels is not (the flag would change nothing in it).
TEST_F(CudaStreams, AKernelCapturedOnAHighPriorityStreamKeepsItsPriorityInTheGraph) {
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  if (least == greatest) GTEST_SKIP() << "this GPU has a single stream priority";
  for (const int priority : {least, greatest}) {
    Stream s(kGpu, priority);
    StreamGuard g(s);
    const Tensor x = full({1000}, -1.0, kF32Gpu);  // made on `s`: the capture waits for nothing
    const Tensor y = full({1000}, 5.0, kF32Gpu);
    s.synchronize();
    cudaGraph_t graph = capture::capture_stream(s.get(), "test", "", [&] { copy_(y, relu(x)); });
    const bool prioritized = capture::has_prioritized_kernel(graph);
    EXPECT_EQ(prioritized, priority != 0)
        << "a graph captured on a stream of priority " << priority;
    cudaGraphExec_t exec = capture::instantiate(graph);
    ASSERT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
    s.synchronize();
    EXPECT_EQ(y.to_vector<float>(), std::vector<float>(1000, 0.0f));
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// capture::Graph owns a graph and its executable: an update to a graph of another topology is
// refused by name and leaves the executable as it was; an update to the same topology with other
// pointers is taken (the owner keeps the graph that matches its executable); a moved-from owner
// holds nothing (each handle destroyed once).
TEST_F(CudaStreams, AGraphOwnerUpdatesInPlaceOrSaysWhyNot) {
  Stream s(kGpu);
  StreamGuard g(s);
  const Tensor x = full({256}, 1.0, kF32Gpu), other = full({256}, 2.0, kF32Gpu);
  const Tensor y = full({256}, 0.0, kF32Gpu), z = full({256}, 0.0, kF32Gpu);
  s.synchronize();
  auto capture = [&](const std::function<void()>& body) {
    return capture::Graph(capture::capture_stream(s.get(), "test", "", body));
  };
  capture::Graph graph = capture([&] { copy_(y, x); });
  graph.instantiate();
  capture::Graph wider = capture([&] {
    copy_(y, x);
    copy_(z, x);
  });
  const cudaGraph_t kept = graph.graph();
  const char* refused = graph.update_to(wider);
  ASSERT_NE(refused, nullptr) << "an update to another topology was taken";
  EXPECT_EQ(graph.graph(), kept);
  graph.launch(s.get());
  s.synchronize();
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(256, 1.0f));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(256, 0.0f)) << "the refused graph ran";
  capture::Graph same_shape = capture([&] { copy_(y, other); });
  const cudaGraph_t fresh = same_shape.graph();
  ASSERT_EQ(graph.update_to(same_shape), nullptr);
  EXPECT_EQ(graph.graph(), fresh);  // the graph that matches the executable
  EXPECT_EQ(same_shape.graph(), kept);
  graph.launch(s.get());
  s.synchronize();
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(256, 2.0f));
  capture::Graph moved = std::move(graph);
  EXPECT_FALSE(graph);  // NOLINT(bugprone-use-after-move): the moved-from state is defined
  EXPECT_EQ(graph.exec(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_NE(moved.exec(), nullptr);
  moved.launch(s.get());
  s.synchronize();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaStreams, ATensorUsedOnTwoStreamsAndDroppedInsideACaptureGoesBackToThePool) {
  Stream home(kGpu), reader(kGpu);
  empty_cache(kGpu);
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  const auto used = [&] {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::uint64_t bytes = 0;
    EXPECT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &bytes), cudaSuccess);
    return bytes;
  };
  std::optional<Tensor> t;
  {
    StreamGuard g(home);
    t = full({1 << 20}, 1.0, kF32Gpu);  // 4 MiB
  }
  Tensor kept;
  {
    StreamGuard g(reader);
    kept = relu(*t);  // read on `reader`: its release makes `home` wait for `reader` first
  }
  const std::uint64_t before = used();
  cudaGraph_t graph = capture::capture_stream(home.get(), "test", "", [&] { t.reset(); });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(capture::count_nodes(graph).nodes.size(), 0u) << "no event wait, no free node";
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // Released once the capture ended, into the block cache (Note [Block cache]); from there back
  // to the pool: nothing lost.
  EXPECT_EQ(cached_bytes(kGpu), std::uint64_t{4} << 20) << "expected the 4 MiB in the cache";
  empty_cache(kGpu);
  EXPECT_EQ(before - used(), std::uint64_t{4} << 20) << "expected the 4 MiB back in the pool";
  EXPECT_EQ(cached_bytes(kGpu), 0u);
  EXPECT_EQ(sum(kept).item(), double(1 << 20));
}

}  // namespace
}  // namespace graphward
