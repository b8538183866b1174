// BackwardGraph on the GPU: replayed gradients equal eager ones over 100 steps with
// fresh data; the graph mirrors the forward's streams; shape changes, reallocated parameters and a
// changed branch each take the right path (counters) with correct gradients; micro-batches
// accumulate under replay; capture-unsafe work is refused by name.
//
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "graphward/capture/backward_graph.h"
#include "graphward/capture/stream_capture.h"
#include "json_check.h"
#include "graphward/engine/tape/deferred_release.h"
#include "graphward/engine/tape/tape_log.h"
#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
constexpr TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaBackwardGraph : public testing::CudaTest {};

// K branches of D x (linear + relu) on K streams, summed, mse against a target.
struct Model {
  std::vector<std::vector<Tensor>> w, b;
  std::vector<std::unique_ptr<Stream>> streams;
  Model(int k, int d, std::int64_t n, std::uint64_t seed = 1) {
    w.resize(k);
    b.resize(k);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) {
        w[i].push_back(uniform({n, n}, -0.2, 0.2, seed++, kF32Gpu).set_requires_grad(true));
        b[i].push_back(uniform({n}, -0.1, 0.1, seed++, kF32Gpu).set_requires_grad(true));
      }
      streams.push_back(std::make_unique<Stream>(kGpu));
    }
  }
  Tensor loss(const Tensor& x, const Tensor& target, int skip_branch = -1) const {
    Tensor total;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (static_cast<int>(i) == skip_branch) continue;
      Tensor h = x;
      {
        StreamGuard g(*streams[i]);
        for (std::size_t j = 0; j < w[i].size(); ++j) h = relu(linear(h, w[i][j], b[i][j]));
      }
      total = total.defined() ? add(total, h) : h;
    }
    return mse_loss(total, target);
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < w.size(); ++i) {
      for (std::size_t j = 0; j < w[i].size(); ++j) {
        out.push_back(w[i][j].grad().to_vector<float>());
        out.push_back(b[i][j].grad().to_vector<float>());
      }
    }
    return out;
  }
};

// One step of the loop a user writes — the forward in a StepScope, the backward a BackwardGraph's
// — and the eager backward of `eager` (same parameters) on the same batch: their gradients must be
// bitwise equal.
void step_both(BackwardGraph& bw, StepArena& arena, const Model& graphed, const Model& eager,
               const Tensor& x, const Tensor& target, int s) {
  {
    StepScope scope(arena);
    bw.backward(graphed.loss(x, target), GradWrite::kOverwrite);
    arena.record_step_end(current_stream(kGpu));
  }
  backward(eager.loss(x, target), {.grad_write = GradWrite::kOverwrite});
  ASSERT_EQ(graphed.grads(), eager.grads()) << "step " << s << "; " << bw.stats().reason;
}

// 100 steps of fresh data through static inputs: every replayed gradient bitwise equal to the
// eager backward's (the same kernels), 1 capture, 0 updates; returns the graph's shape.
GraphStats hundred_steps(const BackwardGraphOptions& options) {
  Model graphed(4, 3, 64), eager(4, 3, 64);  // same initialization
  const Tensor x = zeros({16, 64}, kF32Gpu), target = zeros({16, 64}, kF32Gpu);  // static inputs
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu, options);
  for (int s = 0; s < 100; ++s) {
    {
      NoGradGuard no_grad;
      copy_(x, randn({16, 64}, 1000 + s, kF32Gpu));
      copy_(target, randn({16, 64}, 5000 + s, kF32Gpu));
    }
    {
      StepScope step(arena);
      bw.backward(graphed.loss(x, target), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(eager.loss(x, target), {.grad_write = GradWrite::kOverwrite});
    EXPECT_EQ(graphed.grads(), eager.grads()) << "step " << s << "; " << bw.stats().reason;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_EQ(bw.stats().eager_backwards, 1u);
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, 99u);
  // Every graph step's signature came from the step's tape log, not a walk (Note [Tape log]).
  EXPECT_EQ(bw.stats().log_signatures, 99u) << bw.stats().walk_reason;
  // ... and the forward matched the replayed tape as it recorded it.
  EXPECT_TRUE(bw.stats().matched_in_forward);
  // Intermediates come from the executable's pool: no memory nodes in the graph, and its memory
  // is reported.
  const GraphStats st = bw.stats().graph;
  EXPECT_EQ(st.memory_nodes, 0u);
  EXPECT_GT(st.memory_bytes, 0u);
  EXPECT_GT(st.kernel_nodes, 4u * 3u * 3u);
  bw.write_dot(::testing::TempDir() + "backward_graph.dot");
  return st;
}

TEST_F(CudaBackwardGraph, ReplayedGradientsEqualEagerOnesOver100StepsOfFreshData) {
  const GraphStats st = hundred_steps({.backward = {.split_weight_grads = false}});
  // The graph mirrors the forward: four branch streams, each starting after the loss's backward
  // on the caller's stream (no fork of its own needed) and joined back.
  EXPECT_EQ(st.streams, 5u);
  EXPECT_EQ(st.forks, 0u);
  EXPECT_EQ(st.joins, 4u);
  // ... and the graph itself: one root (the loss's backward) forking into 4 chains, which end the
  // graph (the capture's join is the graph's end), no node joining two.
  EXPECT_EQ(st.topology.roots, 1u);
  EXPECT_EQ(st.topology.fork_nodes, 1u);
  EXPECT_EQ(st.topology.max_fan_out, 4u);
  EXPECT_EQ(st.topology.join_nodes, 0u);
  EXPECT_EQ(st.topology.sinks, 4u);
  EXPECT_EQ(st.topology.longest_path, 1 + (st.kernel_nodes - 1) / 4);  // 4 equal chains
}

TEST_F(CudaBackwardGraph, WeightGradientParallelismIsOnByDefaultAndReplaysBitwiseEqual) {
  EXPECT_FALSE(BackwardGraphOptions{}.backward.split_weight_grads.has_value());  // unset: on here
  const GraphStats st = hundred_steps({});
  // A side stream per branch for the weight gradients (the caller's, 4 branches, 4 sides).
  EXPECT_EQ(st.streams, 9u);
  // One root forking into the 4 branches; in each branch (3 layers; the input needs no
  // gradient), layers 3 and 2 fork their dW/db off to the branch's side stream, where layer 2's
  // waits for both its relu backward and layer 3's dW/db (a join); layer 1 has no dX to overlap
  // with and keeps its dW/db on the branch stream. So each branch ends twice (side, branch).
  EXPECT_EQ(st.topology.roots, 1u);
  EXPECT_EQ(st.topology.max_fan_out, 4u);
  EXPECT_EQ(st.topology.fork_nodes, 1u + 4u * 2u);
  EXPECT_EQ(st.topology.join_nodes, 4u);
  EXPECT_EQ(st.topology.sinks, 8u);
  // The critical path is shorter than one branch's chain of every kernel.
  EXPECT_LT(st.topology.longest_path, 1 + (st.kernel_nodes - 1) / 4);
}

// Note [Input slots]: the loop a user writes — each step's batch a new tensor at another address
// (a loader's ring of prefetched batches, fresh values), the forward in a StepScope — replays one
// graph with no update: the batch (saved by every branch's first layer: one slot) and the target
// (the loss's: another) are read through slots refreshed before each launch. Every gradient is
// bitwise the eager backward's on the same batch.
TEST_F(CudaBackwardGraph, ANaturalLoopOfNewBatchTensorsReplaysOneGraphWithNoUpdate) {
  Model graphed(4, 3, 64), eager(4, 3, 64);
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu);
  std::vector<std::pair<Tensor, Tensor>> ring(3);  // batches kept alive: other addresses
  std::set<const void*> addresses;
  for (int s = 0; s < 100; ++s) {
    auto& [x, target] = ring[static_cast<std::size_t>(s) % ring.size()];
    x = randn({16, 64}, 1000 + static_cast<std::uint64_t>(s), kF32Gpu);
    target = randn({16, 64}, 5000 + static_cast<std::uint64_t>(s), kF32Gpu);
    addresses.insert(x.raw_data());
    ASSERT_NO_FATAL_FAILURE(step_both(bw, arena, graphed, eager, x, target, s));
  }
  EXPECT_GE(addresses.size(), 3u);  // the batches did move
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, 99u);
  EXPECT_EQ(bw.stats().log_signatures, 99u) << bw.stats().walk_reason;
  const GraphStats st = bw.stats().graph;
  EXPECT_EQ(st.input_slots, 2u);  // x (four places, one copy) and the target
  EXPECT_EQ(st.input_slot_bytes, 2u * 16u * 64u * sizeof(float));
  EXPECT_GT(bw.stats().host.refresh_us, 0.0);
}

// The same loop where a saved tensor stays (a constant) reads it in place, with no slot; and a
// structure first captured after the warm-up takes its slots at the first step that moves its
// batch: one update, then replays.
TEST_F(CudaBackwardGraph, OnlyTensorsThatMoveGetSlotsAndALaterStructureTakesThemInOneUpdate) {
  Model graphed(1, 2, 32), eager(1, 2, 32);
  const Tensor constant_target = randn({8, 32}, 9, kF32Gpu);
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu);
  std::vector<std::pair<Tensor, Tensor>> ring(3);  // batches kept alive: other addresses
  auto step = [&](int s, std::int64_t rows) {
    auto& [x, fresh_target] = ring[static_cast<std::size_t>(s) % ring.size()];
    x = randn({rows, 32}, 300 + static_cast<std::uint64_t>(s), kF32Gpu);
    fresh_target = randn({rows, 32}, 400 + static_cast<std::uint64_t>(s), kF32Gpu);
    const Tensor& target = rows == 8 ? constant_target : fresh_target;
    step_both(bw, arena, graphed, eager, x, target, s);
  };
  for (int s = 0; s < 6; ++s) step(s, 8);
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().graph.input_slots, 1u);  // x only: the target stayed
  for (int s = 6; s < 12; ++s) step(s, 4);  // another batch size: a new structure
  EXPECT_EQ(bw.stats().counters.captures, 2u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 1u) << bw.stats().reason;  // its batch moved once: slots
  EXPECT_EQ(bw.stats().graph.input_slots, 2u);  // its target is new every step too
  // The first structure again: its graph, never captured again (the step arena re-recorded the
  // activations for the other structure, so they may have moved: at most an update).
  for (int s = 12; s < 15; ++s) step(s, 8);
  EXPECT_EQ(bw.stats().counters.captures, 2u) << bw.stats().reason;
  EXPECT_LE(bw.stats().counters.updates, 2u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().graph.input_slots, 1u);
}

// A slot is refreshed after its tensor's producer: each step's batch is written on another stream
// behind a 30 ms stall, and the forward and backward() are enqueued at once on the caller's
// stream. A refresh that read the batch early would copy the memory's earlier contents (another
// step's batch) and the gradients would differ from the eager backward's on the same batch.
TEST_F(CudaBackwardGraph, ASlotIsRefreshedOnlyAfterItsTensorsProducerOnAnotherStream) {
  Model graphed(1, 2, 32), eager(1, 2, 32);
  Stream loader(kGpu);
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu);
  std::vector<Tensor> ring(2);
  const Tensor target = randn({8, 32}, 1, kF32Gpu);
  for (int s = 0; s < 6; ++s) {
    Tensor& x = ring[static_cast<std::size_t>(s) % ring.size()];
    {
      StreamGuard on(loader);
      x = Tensor::empty({8, 32}, kF32Gpu);  // the memory of an earlier batch, maybe
      if (s >= 2) testing::stall(loader.get(), 30);
      NoGradGuard no_grad;
      copy_(x, randn({8, 32}, 700 + static_cast<std::uint64_t>(s), kF32Gpu));
    }
    ASSERT_NO_FATAL_FAILURE(step_both(bw, arena, graphed, eager, x, target, s));
  }
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().graph.input_slots, 1u);
}

// capture::SlotRefresh (Note [Input slots]) over the family of slots a step can bring, more of
// them than one launch takes: 2 to 2 MiB bytes; both ends 16-byte aligned, only 4-byte aligned, or
// a view 2 bytes off (copied by a cudaMemcpyAsync of its own); sizes with a tail past the last
// 4-byte word. The sources are written on another stream held for 30 ms: a copy that did not wait
// for their producer would read the old bytes. Every slot must equal its source byte for byte and
// nothing around a slot may be touched.
TEST_F(CudaBackwardGraph, ASlotRefreshCopiesEverySlotExactlyAndOnlyAfterItsProducer) {
  struct Case {
    std::size_t elements;            // bfloat16: 2 bytes each
    std::size_t src_skew, dst_skew;  // bytes past a 64-byte boundary
  };
  const std::vector<Case> cases = {{1, 0, 0},
                                   {3, 0, 0},
                                   {8, 0, 0},
                                   {9, 0, 4},
                                   {8, 4, 0},
                                   {5, 4, 4},
                                   {7, 2, 0},
                                   {6, 0, 2},
                                   {1, 2, 2},
                                   {4096, 0, 0},
                                   {4097, 8, 8},
                                   {1 << 20, 0, 0},
                                   {(1 << 20) + 3, 4, 0},
                                   {12345, 2, 6}};
  std::vector<std::size_t> src_at, dst_at;
  std::size_t end = 0;
  for (const Case& c : cases) {
    const std::size_t base = (end + 127) / 64 * 64;  // a gap of 64 bytes at least
    src_at.push_back(base + c.src_skew);
    dst_at.push_back(base + c.dst_skew);
    end = base + 8 + 2 * c.elements;
  }
  const std::size_t words = (end + 64) / 4;
  std::vector<std::int32_t> before(words), after(words);
  for (std::size_t i = 0; i < words; ++i) {
    before[i] = static_cast<std::int32_t>(0x9e3779b9u * static_cast<std::uint32_t>(i + 1));
    after[i] = static_cast<std::int32_t>(0x85ebca6bu * static_cast<std::uint32_t>(i + 7));
  }
  const Shape pool_shape{static_cast<std::int64_t>(words)};
  const Tensor src_pool = from_vector(before, pool_shape, kGpu);
  const Tensor dst_pool = zeros(pool_shape, {DType::kInt32, kGpu});
  Stream loader(kGpu);
  const cudaStream_t caller = current_stream(kGpu);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  {
    StreamGuard on(loader);
    testing::stall(loader.get(), 30);
    NoGradGuard no_grad;
    copy_(src_pool, from_vector(after, pool_shape, kGpu));  // on the loader, after the hold
  }
  auto view = [](const Tensor& pool, std::size_t at, std::size_t elements, cudaStream_t stream) {
    char* data = static_cast<char*>(pool.raw_data()) + at;
    return Tensor::from_storage(Storage::borrow(kGpu, data, 2 * elements, stream, pool.storage()),
                                {static_cast<std::int64_t>(elements)}, DType::kBFloat16);
  };
  std::vector<Tensor> keep;
  capture::SlotRefresh refresh(caller);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Tensor src = view(src_pool, src_at[i], cases[i].elements, loader.get());
    const Tensor slot = view(dst_pool, dst_at[i], cases[i].elements, caller);
    refresh.add(slot, src);
    keep.push_back(src);
    keep.push_back(slot);
  }
  refresh.flush();
  const std::vector<std::int32_t> got = dst_pool.to_vector<std::int32_t>();
  std::vector<unsigned char> want(4 * words, 0), have(4 * words), source(4 * words);
  std::memcpy(have.data(), got.data(), have.size());
  std::memcpy(source.data(), after.data(), source.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::memcpy(want.data() + dst_at[i], source.data() + src_at[i], 2 * cases[i].elements);
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto first = want.begin() + static_cast<std::ptrdiff_t>(dst_at[i]);
    const auto last = first + static_cast<std::ptrdiff_t>(2 * cases[i].elements);
    EXPECT_TRUE(std::equal(first, last, have.begin() + static_cast<std::ptrdiff_t>(dst_at[i])))
        << "slot " << i << ": " << cases[i].elements << " bfloat16 from byte " << src_at[i]
        << " into byte " << dst_at[i];
  }
  EXPECT_TRUE(want == have) << "a byte outside the slots changed, or a slot is wrong";
}

// Two layers on a side stream; the loss, on the caller's stream, reads only the last output. The
// hidden activation `h` is made on the side stream and read there alone in the forward: only the
// replayed graph reads it on the caller's stream, so only the record of that read orders later
// work on it after the graph.
struct SideStep {
  Stream side{kGpu};
  Tensor w1, w2;
  explicit SideStep(std::uint64_t seed)
      : w1(uniform({32, 32}, -0.2, 0.2, seed, kF32Gpu).set_requires_grad(true)),
        w2(uniform({32, 32}, -0.2, 0.2, seed + 1, kF32Gpu).set_requires_grad(true)) {}
  Tensor loss(const Tensor& x, const Tensor& target, Tensor* hidden = nullptr) const {
    Tensor h, out;
    {
      StreamGuard on(side);
      h = relu(linear(x, w1));  // saved by the relu and by the second linear
      out = linear(h, w2);
    }
    if (hidden) *hidden = h;
    return mse_loss(out, target);
  }
  std::vector<std::vector<float>> grads() const {
    return {w1.grad().to_vector<float>(), w2.grad().to_vector<float>()};
  }
};

// Note [Reads of a replayed step] (engine/runtime/memory.h): a replay releases its step as a whole, with
// one event for the graph's read of every saved tensor. At the last step the caller's stream is
// stalled before backward(), the activations are freed on the release worker (waited for), and
// the side stream at once takes blocks of their size and overwrites them. Were a free not ordered
// after the graph's read (rule [reuse after use]), the graph would read the overwritten memory and
// the gradients would differ from the eager backward's.
TEST_F(CudaBackwardGraph, AStepReleasedAsAWholeFreesItsActivationsOnlyAfterTheGraphReadThem) {
  SideStep graphed(1), eager(1);
  BackwardGraph bw(kGpu);
  const cudaStream_t caller = current_stream(kGpu);
  for (int s = 0; s < 5; ++s) {
    const Tensor x = randn({16, 32}, 100 + static_cast<std::uint64_t>(s), kF32Gpu);
    const Tensor target = randn({16, 32}, 200 + static_cast<std::uint64_t>(s), kF32Gpu);
    {
      const Tensor loss = graphed.loss(x, target);
      if (s == 4) testing::stall(caller, 50);
      bw.backward(loss, GradWrite::kOverwrite);
    }
    if (s >= 2) {
      EXPECT_TRUE(bw.stats().host.whole_step) << "step " << s;
    }
    if (s == 4) {
      detail::wait_for_releases();  // the activations are freed
      StreamGuard on(graphed.side);
      NoGradGuard no_grad;
      std::vector<Tensor> reuse;
      for (int k = 0; k < 8; ++k) {
        reuse.push_back(Tensor::empty({16, 32}, kF32Gpu));
        copy_(reuse.back(), full({16, 32}, 1e6, kF32Gpu));
      }
    }
    backward(eager.loss(x, target), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(graphed.grads(), eager.grads()) << "step " << s << "; " << bw.stats().reason;
    detail::tape_log_reset();  // the reference's tape was logged too: the next step begins here
  }
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
}

// The same with the activation kept by the caller and written in place on a third stream right
// after backward(): the write waits for the graph's read (rule [read after write]), though no
// stream but the side stream used the memory in the forward.
TEST_F(CudaBackwardGraph, AKeptActivationWrittenOnAnotherStreamWaitsForTheReplaysRead) {
  SideStep graphed(1), eager(1);
  Stream writer(kGpu);
  BackwardGraph bw(kGpu);
  const cudaStream_t caller = current_stream(kGpu);
  for (int s = 0; s < 5; ++s) {
    const Tensor x = randn({16, 32}, 300 + static_cast<std::uint64_t>(s), kF32Gpu);
    const Tensor target = randn({16, 32}, 400 + static_cast<std::uint64_t>(s), kF32Gpu);
    Tensor h;
    const Tensor loss = graphed.loss(x, target, &h);
    if (s == 4) testing::stall(caller, 50);
    bw.backward(loss, GradWrite::kOverwrite);
    if (s >= 2) {
      EXPECT_TRUE(bw.stats().host.whole_step) << "step " << s;
    }
    if (s == 4) {
      StreamGuard on(writer);
      NoGradGuard no_grad;
      copy_(h.detach(), zeros({16, 32}, kF32Gpu));
    }
    backward(eager.loss(x, target), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(graphed.grads(), eager.grads()) << "step " << s << "; " << bw.stats().reason;
    detail::tape_log_reset();  // as above
  }
}

// The loop without a StepScope, an optimizer writing the parameters right after each backward():
// the step's saved tensors may still be on the release worker then. The writes are not changes of
// a live tape (the step's saves are given back as each parameter's storage settles): every step's
// signature comes from the tape log, and every replay releases its step as a whole.
TEST_F(CudaBackwardGraph, AnOptimizerRightAfterTheReplayLeavesTheNextStepsTapeLogUsable) {
  Model m(2, 2, 32);
  std::vector<Tensor> params;
  for (std::size_t i = 0; i < m.w.size(); ++i) {
    params.insert(params.end(), m.w[i].begin(), m.w[i].end());
    params.insert(params.end(), m.b[i].begin(), m.b[i].end());
  }
  AdamW opt(params, {.lr = 1e-3});
  BackwardGraph bw(kGpu);
  int whole = 0;
  for (int s = 0; s < 20; ++s) {
    const Tensor x = randn({8, 32}, 500 + static_cast<std::uint64_t>(s), kF32Gpu);
    const Tensor target = randn({8, 32}, 600 + static_cast<std::uint64_t>(s), kF32Gpu);
    bw.backward(m.loss(x, target), GradWrite::kOverwrite);
    whole += bw.stats().host.whole_step;
    opt.step();
  }
  const auto c = bw.stats().counters;
  EXPECT_EQ(c.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(c.replays, 19u);
  EXPECT_EQ(bw.stats().log_signatures, c.replays) << bw.stats().walk_reason;
  EXPECT_EQ(whole, 19);
}

TEST_F(CudaBackwardGraph, ShapesParametersAndBranchesTakeTheRightPath) {
  Model m(2, 2, 32), ref(2, 2, 32);
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);
  auto step = [&](const Tensor& x, const Tensor& t, int skip = -1) {
    {
      StepScope scope(arena);
      bw.backward(m.loss(x, t, skip), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(ref.loss(x, t, skip), {.grad_write = GradWrite::kOverwrite});
    EXPECT_EQ(m.grads(), ref.grads()) << bw.stats().reason;  // never a stale replay
  };
  const Tensor x8 = randn({8, 32}, 1, kF32Gpu), t8 = randn({8, 32}, 2, kF32Gpu);
  const Tensor x4 = randn({4, 32}, 3, kF32Gpu), t4 = randn({4, 32}, 4, kF32Gpu);
  step(x8, t8);  // warm-up (eager)
  step(x8, t8);  // capture
  step(x8, t8);  // replay
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  step(x4, t4);  // another batch size: a new structure
  EXPECT_EQ(bw.stats().counters.captures, 2u);
  EXPECT_NE(bw.stats().reason.find("capture"), std::string::npos) << bw.stats().reason;
  step(x8, t8);  // the first structure again: its graph, replayed or updated, never re-captured
  EXPECT_EQ(bw.stats().counters.captures, 2u) << bw.stats().reason;
  // A parameter reallocated (same shape): the same structure with another address: an update.
  const std::uint64_t updates = bw.stats().counters.updates;
  {
    NoGradGuard no_grad;
    const Tensor moved = m.w[0][0].clone();
    const Tensor moved_ref = ref.w[0][0].clone();
    moved.grad() = m.w[0][0].grad();
    moved_ref.grad() = ref.w[0][0].grad();
    m.w[0][0] = moved.set_requires_grad(true);
    ref.w[0][0] = moved_ref.set_requires_grad(true);
  }
  step(x8, t8);
  EXPECT_EQ(bw.stats().counters.captures, 2u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, updates + 1) << bw.stats().reason;
  EXPECT_NE(bw.stats().reason.find("update"), std::string::npos) << bw.stats().reason;
  // A branch left out: a new structure.
  step(x8, t8, 1);
  EXPECT_EQ(bw.stats().counters.captures, 3u);
  EXPECT_LE(bw.stats().cached_graphs, 8u);
}

// Each of `got`'s gradients within `tolerance` (relative) of `want`'s.
void expect_grads_near(const std::vector<std::vector<float>>& got,
                       const std::vector<std::vector<float>>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(testing::rel_error(std::vector<double>(got[i].begin(), got[i].end()),
                                 std::vector<double>(want[i].begin(), want[i].end())),
              tolerance)
        << "gradient " << i;
  }
}

TEST_F(CudaBackwardGraph, MicroBatchesAccumulateUnderReplayLikeOneLargeBatch) {
  Model micro(1, 2, 32), whole(1, 2, 32);
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  const Tensor xa = zeros({8, 32}, kF32Gpu), ta = zeros({8, 32}, kF32Gpu);
  BackwardGraph bw(kGpu);
  std::vector<std::vector<float>> got;
  for (int s = 0; s < 3; ++s) {
    for (const Tensor& w : micro.w[0]) w.grad() = zeros(w.shape(), kF32Gpu);
    for (const Tensor& b : micro.b[0]) b.grad() = zeros(b.shape(), kF32Gpu);
    for (int half = 0; half < 2; ++half) {
      {
        NoGradGuard no_grad;
        // rows [8·half, 8·half + 8) of x and t, through a matmul with a selection matrix
        std::vector<float> sel(8 * 16, 0.f);
        for (int r = 0; r < 8; ++r) sel[r * 16 + 8 * half + r] = 1.f;
        const Tensor pick = from_vector(sel, {8, 16}, kGpu);
        copy_(xa, matmul(pick, x));
        copy_(ta, matmul(pick, t));
      }
      bw.backward(mul(micro.loss(xa, ta), 0.5), GradWrite::kAccumulate);
    }
    got = micro.grads();
  }
  backward(whole.loss(x, t));
  const auto want = whole.grads();
  expect_grads_near(got, want, 1e-5);
  EXPECT_GT(bw.stats().counters.replays, 0u);
}

// A loop of two micro-batches a step — the first backward overwrites the .grads, the second adds
// to them — with new batch tensors every step: each program runs its own warm-up in the first step
// and is captured in the second, shaped as every later step, so the loop replays with no update;
// the .grads are the eager twin's.
TEST_F(CudaBackwardGraph, EachProgramWarmsUpOnceAndAMicroBatchedLoopReplaysWithNoUpdate) {
  Model m(2, 2, 32), ref(2, 2, 32);
  StepArena arena(kGpu);
  BackwardGraph bw(kGpu);
  std::vector<Tensor> xs(2), ts(2);
  for (std::uint64_t s = 0; s < 5; ++s) {
    StepScope scope(arena);
    for (std::uint64_t k = 0; k < 2; ++k) {
      xs[k] = randn({8, 32}, 100 + 4 * s + 2 * k, kF32Gpu);  // a new batch every step
      ts[k] = randn({8, 32}, 101 + 4 * s + 2 * k, kF32Gpu);
      bw.backward(mul(m.loss(xs[k], ts[k]), 0.5),
                  k == 0 ? GradWrite::kOverwrite : GradWrite::kAccumulate);
    }
    arena.record_step_end(current_stream(kGpu));
  }
  const BackwardGraphStats st = bw.stats();
  EXPECT_EQ(st.eager_backwards, 2u) << "one warm-up for each program";
  EXPECT_EQ(st.counters.captures, 2u) << st.reason;
  EXPECT_EQ(st.counters.updates, 0u) << st.reason;
  EXPECT_EQ(st.counters.replays, 8u);  // steps 1 to 4, two launches each
  for (std::size_t k = 0; k < 2; ++k) {
    backward(mul(ref.loss(xs[k], ts[k]), 0.5),
             {.grad_write = k == 0 ? GradWrite::kOverwrite : GradWrite::kAccumulate});
  }
  const auto got = m.grads(), want = ref.grads();
  expect_grads_near(got, want, 1e-5);
}

// Two batches and the static inputs they are copied into, one model and its eager twin: with a
// step arena, every step after the capture is a plain replay. For the tests that hold a stream and
// look at one .grad.
struct StaticSteps {
  Model m{1, 2, 64}, ref{1, 2, 64};
  Tensor x1 = randn({16, 64}, 1, kF32Gpu), t1 = randn({16, 64}, 2, kF32Gpu);
  Tensor x2 = randn({16, 64}, 3, kF32Gpu), t2 = randn({16, 64}, 4, kF32Gpu);
  Tensor x = zeros({16, 64}, kF32Gpu), t = zeros({16, 64}, kF32Gpu);
  StepArena arena{kGpu};
  // One step of `bw` on (xs, ts), copied into the static inputs; the loss times `scale` if given.
  void step(BackwardGraph& bw, const Tensor& xs, const Tensor& ts,
            std::optional<double> scale = std::nullopt) {
    {
      NoGradGuard no_grad;
      copy_(x, xs);
      copy_(t, ts);
    }
    StepScope scope(arena);
    const Tensor loss = m.loss(x, t);
    bw.backward(scale ? mul(loss, *scale) : loss, GradWrite::kOverwrite);
    arena.record_step_end(current_stream(kGpu));
  }
};

TEST_F(CudaBackwardGraph, AGradientStillReadOnAnotherStreamIsNotOverwrittenByTheNextReplay) {
  // An "optimizer" on a stream of its own (not one the forward used) reads w.grad after a 50 ms
  // stall; the next step's replayed backward overwrites w.grad on the caller's stream. The
  // replay must wait for that stream (rule [read after write]): else the reader sees the next
  // step's gradient.
  StaticSteps st;
  auto& [m, ref, x1, t1, x2, t2, x, t, arena] = st;
  BackwardGraph bw(kGpu);
  auto step = [&](const Tensor& xs, const Tensor& ts) { st.step(bw, xs, ts); };
  for (int i = 0; i < 4; ++i) step(x1, t1);  // warm-up, capture, replays
  ASSERT_EQ(bw.stats().counters.captures, 1u);
  const std::uint64_t updates = bw.stats().counters.updates, replays = bw.stats().counters.replays;
  const std::vector<float> step_a = m.w[0][0].grad().to_vector<float>();
  Stream optimizer(kGpu);
  Tensor snapshot;
  {
    StreamGuard g(optimizer);
    // The read's kernel once before the stall: loading a kernel's module on first use (CUDA's
    // lazy loading) can wait for the whole device, which would order the replay by accident.
    (void)mul(m.w[0][0].grad(), 1.0);
    optimizer.synchronize();
    testing::stall(optimizer.get(), 50);    // the stream is held 50 ms
    snapshot = mul(m.w[0][0].grad(), 1.0);  // then the read, behind it in stream order
  }
  step(x2, t2);
  EXPECT_EQ(bw.stats().counters.replays, replays + 1);
  EXPECT_EQ(bw.stats().counters.updates, updates) << bw.stats().reason;  // a plain replay
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(snapshot.to_vector<float>(), step_a);
  backward(ref.loss(x2, t2), {.grad_write = GradWrite::kOverwrite});
  EXPECT_EQ(m.grads(), ref.grads());
  EXPECT_NE(m.w[0][0].grad().to_vector<float>(), step_a);
}

// Note [Writes of a replayed graph] (engine/runtime/memory.h): a replay over the same .grads as the step
// before records its writes with one bump, which each .grad applies when it is next consulted. A
// reader on another stream must still wait for the replay: one that wrote the .grad last before
// it (its producer until the replay's write is applied) and one that never used it. The caller's
// stream is held 50 ms before the step, so a reader that does not wait reads the old values.
TEST_F(CudaBackwardGraph, AReaderOfAGradientAfterAPlainReplayWaitsForIt) {
  StaticSteps st;
  auto& [m, ref, x1, t1, x2, t2, x, t, arena] = st;
  BackwardGraph bw(kGpu);
  auto step = [&](const Tensor& xs, const Tensor& ts) { st.step(bw, xs, ts); };
  for (int i = 0; i < 4; ++i) step(x1, t1);  // warm-up, capture, replays over the same .grads
  ASSERT_EQ(bw.stats().counters.captures, 1u);
  const std::uint64_t updates = bw.stats().counters.updates, replays = bw.stats().counters.replays;
  const Tensor& g = m.w[0][0].grad();
  const std::vector<float> sevens(static_cast<std::size_t>(g.numel()), 7.0f);
  Stream writer(kGpu), reader(kGpu);
  {
    NoGradGuard no_grad;
    {
      StreamGuard w(writer);
      copy_(g, full(g.shape(), 7.0, kF32Gpu));  // the .grad's last writer before the replay
      (void)mul(g, 1.0);  // the read's kernel loaded before the stall (CUDA's lazy loading)
    }
    StreamGuard r(reader);
    (void)mul(g, 1.0);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(g.to_vector<float>(), sevens);
  testing::stall(current_stream(kGpu), 50);  // the replay runs after 50 ms
  step(x2, t2);
  Tensor from_writer, from_reader;
  {
    NoGradGuard no_grad;
    {
      StreamGuard w(writer);
      from_writer = mul(g, 1.0);
    }
    StreamGuard r(reader);
    from_reader = mul(g, 1.0);
  }
  EXPECT_EQ(bw.stats().counters.replays, replays + 1);
  EXPECT_EQ(bw.stats().counters.updates, updates) << bw.stats().reason;  // a plain replay
  backward(ref.loss(x2, t2), {.grad_write = GradWrite::kOverwrite});
  const std::vector<float> expected = ref.w[0][0].grad().to_vector<float>();
  ASSERT_NE(expected, sevens);
  EXPECT_EQ(from_writer.to_vector<float>(), expected) << "the .grad's last writer read it early";
  EXPECT_EQ(from_reader.to_vector<float>(), expected) << "a new reader read it early";
  step(x1, t1);  // and the next replay still waits for both readers (rule [read after write])
  backward(ref.loss(x1, t1), {.grad_write = GradWrite::kOverwrite});
  EXPECT_EQ(m.grads(), ref.grads());
}

// ... and with two BackwardGraphs over shared parameters, taking turns on one thread (two losses
// of one model): each replay's writes reach the .grads, though the .grads last followed the other
// BackwardGraph's writes. A reader on another stream that waited for the other one's write must
// wait again for this replay (the caller's stream held 50 ms before it).
TEST_F(CudaBackwardGraph, TwoBackwardGraphsOverSharedParametersEachHaveTheirWritesWaitedFor) {
  StaticSteps st;
  auto& [m, ref, x1, t1, x2, t2, x, t, arena] = st;
  BackwardGraph plain(kGpu), doubled(kGpu);
  auto step = [&](BackwardGraph& bw, double scale, const Tensor& xs, const Tensor& ts) {
    st.step(bw, xs, ts, scale);
  };
  for (int i = 0; i < 4; ++i) {  // each: warm-up, capture, replays
    step(plain, 1.0, x1, t1);
    step(doubled, 2.0, x1, t1);
  }
  ASSERT_EQ(plain.stats().counters.captures, 1u);
  ASSERT_EQ(doubled.stats().counters.captures, 1u);
  const Tensor& g = m.w[0][0].grad();
  Stream reader(kGpu);
  {
    NoGradGuard no_grad;
    StreamGuard r(reader);
    (void)mul(g, 1.0);  // waits for the doubled loss's replay, and loads the kernel
  }
  reader.synchronize();
  testing::stall(current_stream(kGpu), 50);
  step(plain, 1.0, x2, t2);  // behind the stall
  Tensor seen;
  {
    NoGradGuard no_grad;
    StreamGuard r(reader);
    seen = mul(g, 1.0);
  }
  backward(ref.loss(x2, t2), {.grad_write = GradWrite::kOverwrite});
  EXPECT_EQ(seen.to_vector<float>(), ref.w[0][0].grad().to_vector<float>())
      << "the reader did not wait for the second BackwardGraph's replay";
  EXPECT_EQ(m.grads(), ref.grads());
}

// Note [Node attributes] (engine/tape/autograd.h): a loss scaled by a factor that changes from step to
// step (a per-batch count, a schedule) is another structure at each new factor — captured anew,
// or replayed from the cache where the factor was seen before — never a replay of a graph whose
// kernels hold another factor: every step's gradients equal the eager backward's.
TEST_F(CudaBackwardGraph, ALossScaleThatChangesIsNeverReplayedWithTheOldScale) {
  Model m(1, 2, 64), ref(1, 2, 64);
  const Tensor x = randn({16, 64}, 1, kF32Gpu), t = randn({16, 64}, 2, kF32Gpu);
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);
  const double scales[] = {1.0, 1.0, 1.0, 1.0, 0.25, 0.25, 3.0, 1.0, 0.25};
  int s = 0;
  for (const double scale : scales) {
    {
      StepScope scope(arena);
      bw.backward(mul(m.loss(x, t), scale), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(mul(ref.loss(x, t), scale), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(m.grads(), ref.grads())
        << "step " << s << ", scale " << scale << "; " << bw.stats().reason;
    ++s;
  }
  // Three factors: three structures; the last two steps replay graphs made before.
  EXPECT_EQ(bw.stats().counters.captures, 3u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u);
}

TEST_F(CudaBackwardGraph, ALossMadeOnAnotherStreamIsWaitedForBeforeTheReplay) {
  // The last layers and the loss run on stream `late`, behind a 50 ms stall; backward() is
  // called on the caller's stream. The graph reads what `late` produced (the last relu's output,
  // the mse's input): the replay must wait for `late` (rule [fork and join]), else it reads it
  // early.
  const Tensor w0 = uniform({64, 64}, -0.2, 0.2, 1, kF32Gpu).set_requires_grad(true);
  const Tensor w1 = uniform({64, 64}, -0.2, 0.2, 2, kF32Gpu).set_requires_grad(true);
  const Tensor w0r = w0.clone().set_requires_grad(true), w1r = w1.clone().set_requires_grad(true);
  Stream late(kGpu);
  auto loss_of = [&](const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& t, bool busy) {
    const Tensor h = relu(linear(x, a));
    StreamGuard g(late);
    if (busy) testing::stall(late.get(), 50);  // `late` is held 50 ms first
    return mse_loss(relu(linear(h, b)), t);
  };
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);
  for (int s = 0; s < 6; ++s) {
    const Tensor x = randn({16, 64}, 10 + s, kF32Gpu), t = randn({16, 64}, 20 + s, kF32Gpu);
    {
      StepScope step(arena);
      bw.backward(loss_of(w0, w1, x, t, s >= 2), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(kGpu));
    }
    backward(loss_of(w0r, w1r, x, t, false), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(w0.grad().to_vector<float>(), w0r.grad().to_vector<float>()) << "step " << s;
    ASSERT_EQ(w1.grad().to_vector<float>(), w1r.grad().to_vector<float>()) << "step " << s;
  }
  EXPECT_GE(bw.stats().counters.replays, 4u);
}

// A timeline's invariants: valid Chrome-trace JSON with one named track per stream, an event per
// step (and per side part), every time after the origin, and the parts on one stream in stream
// order (each ends before the next one on that stream starts). Returns the number of side parts.
std::size_t check_timeline(const std::vector<StepTiming>& steps,
                           const std::vector<std::string>& names, std::size_t plan_steps) {
  EXPECT_EQ(steps.size(), plan_steps);
  const std::string json = chrome_trace(steps, names, "test");
  EXPECT_TRUE(testing::json_valid(json));
  EXPECT_EQ(testing::trace_track_names(json), names);
  std::vector<std::vector<std::pair<float, float>>> on(names.size());
  std::size_t sides = 0;
  for (const StepTiming& t : steps) {
    on[static_cast<std::size_t>(t.stream)].push_back({t.start_ms, t.end_ms});
    if (t.side_stream >= 0) {
      on[static_cast<std::size_t>(t.side_stream)].push_back({t.side_start_ms, t.side_end_ms});
      ++sides;
    }
  }
  std::size_t events = 0;
  for (std::size_t s = 0; s < on.size(); ++s) {
    EXPECT_EQ(testing::trace_events_on(json, static_cast<int>(s)), on[s].size()) << names[s];
    events += on[s].size();
    std::sort(on[s].begin(), on[s].end());
    for (std::size_t i = 0; i < on[s].size(); ++i) {
      EXPECT_GE(on[s][i].first, 0.f) << names[s];
      EXPECT_LE(on[s][i].first, on[s][i].second) << names[s];
      if (i + 1 < on[s].size()) {
        EXPECT_LE(on[s][i].second, on[s][i + 1].first) << names[s];
      }
    }
  }
  EXPECT_EQ(events, steps.size() + sides);
  return sides;
}

TEST_F(CudaBackwardGraph, TheTimelinesOfAnEagerBackwardAndOfAReplayHaveATrackPerStream) {
  Model m(4, 3, 64), ref(4, 3, 64);
  const Tensor x = randn({16, 64}, 1, kF32Gpu), t = randn({16, 64}, 2, kF32Gpu);
  // The gradients every backward below must give (the same data, no optimizer step), made before
  // any BackwardGraph exists: a backward of another tape between two graph steps, outside a
  // StepScope, would make the next step's signature a walk (Note [Tape log]) and re-capture.
  backward(ref.loss(x, t), {.grad_write = GradWrite::kOverwrite});
  const auto want = ref.grads();
  // Eagerly, with weight-gradient parallelism: the caller, 4 branch streams and their 4 sides.
  {
    const Tensor loss = m.loss(x, t);
    const BackwardPlan plan = plan_for({loss}, GradWrite::kOverwrite, {.split_weight_grads = true});
    std::vector<StepTiming> steps;
    backward(loss, {.grad_write = GradWrite::kOverwrite, .timings = &steps,
                    .split_weight_grads = true});
    const std::vector<std::string> names = stream_names(plan);
    ASSERT_EQ(names.size(), 9u);
    EXPECT_EQ(names[0], "stream 0 (caller)");
    // Layers 3 and 2 of each branch compute dW/db on the side (layer 1 has no dX to overlap).
    EXPECT_EQ(check_timeline(steps, names, plan.steps.size()), 8u);
  }
  // A replay of the captured graph (BackwardGraph's default: the same side streams), after the
  // warm-up, the capture and a replay. Each step in a StepScope, as a training loop runs them:
  // without one, the forward's addresses may move between steps (an update, not a replay), which
  // would hide whether trace() disturbed the cache.
  BackwardGraph bw(kGpu);
  StepArena arena(kGpu);
  auto graph_step = [&] {
    StepScope scope(arena);
    bw.backward(m.loss(x, t), GradWrite::kOverwrite);
    arena.record_step_end(current_stream(kGpu));
  };
  auto expect_same_grads = [&] { EXPECT_EQ(m.grads(), want); };
  for (int s = 0; s < 3; ++s) graph_step();
  expect_same_grads();
  ASSERT_EQ(bw.stats().counters.captures, 1u);
  ASSERT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  ASSERT_EQ(bw.stats().counters.replays, 2u);  // every launch counts, the capturing step's included
  {
    StepScope scope(arena);
    const Tensor loss = m.loss(x, t);
    const std::size_t plan_steps = plan_for({loss}, GradWrite::kOverwrite).steps.size();
    const std::vector<StepTiming> steps = bw.trace(loss, GradWrite::kOverwrite);
    arena.record_step_end(current_stream(kGpu));
    ASSERT_EQ(bw.trace_stream_names().size(), 9u);
    EXPECT_EQ(check_timeline(steps, bw.trace_stream_names(), plan_steps), 8u);
    for (const StepTiming& st : steps) EXPECT_EQ(st.host_us, 0.0);
    write_chrome_trace(::testing::TempDir() + "replay_timeline.json", steps,
                       bw.trace_stream_names(), "replay");
  }
  // The traced replay ran the backward for real, and left the cache and the counters alone.
  expect_same_grads();
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(bw.stats().counters.replays, 2u);
  EXPECT_EQ(bw.stats().cached_graphs, 1u);
  // ... and the next step replays as usual: no capture, no update.
  graph_step();
  expect_same_grads();
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.updates, 0u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, 3u);
}

TEST_F(CudaBackwardGraph, CaptureUnsafeWorkIsRefusedByNameAndLeavesNoCaptureOpen) {
  const Tensor w = randn({8}, 1, kF32Gpu).set_requires_grad(true);
  auto loss_with_peek = [&] {
    const Tensor y = mul(w, 3.0);
    const Tensor out = zeros({8}, kF32Gpu);
    InputMeta in{y.shape(), y.dtype(), y.device(), current_stream(kGpu), {y.grad_fn(), Tensor()}};
    out.set_grad_fn(
        make_node("peek", kGpu, current_stream(kGpu), {in}, {8},
                  [](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
                    (void)g.to_vector<float>();  // a host read inside the backward
                    scale_backward(g, 1.0, grads[0]);
                  }));
    return sum(out);
  };
  BackwardGraph bw(kGpu);
  bw.backward(sum(mul(w, 3.0)));  // warm-up
  GW_EXPECT_ERROR(bw.backward(loss_with_peek()), "Tensor::to_vector", "capturing");
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(current_stream(kGpu), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(sum(mul(w, 1.0)).item(), sum(w).item());  // the stream works normally
}

}  // namespace
}  // namespace graphward
