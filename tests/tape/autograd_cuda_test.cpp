// Stream-aware eager autograd on the GPU: multistream backward equals single-stream backward
// bitwise, runs on the forward's streams, and leaves gradients readable on the caller's stream
// with no extra synchronization.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "test_util.h"

namespace graphward {
namespace {
constexpr Device kGpu = Device::cuda(0);
constexpr TensorOptions kF32Gpu{DType::kFloat32, kGpu};
using testing::rel_error;

class CudaAutograd : public testing::PoisonedCudaTest {};

// K branches of D x (linear N->N + relu), summed; mse against a target.
struct BranchModel {
  int branches, depth;
  std::int64_t width, batch;
  std::vector<std::vector<Tensor>> w, b;  // [branch][layer]
  Tensor x, target;

  BranchModel(int k, int d, std::int64_t n, std::int64_t bsz, TensorOptions opt)
      : branches(k), depth(d), width(n), batch(bsz) {
    std::uint64_t seed = 1;
    const double scale = 1.0 / std::sqrt(double(n));
    w.resize(k);
    b.resize(k);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) {
        w[i].push_back(uniform({n, n}, -scale, scale, seed++, opt).set_requires_grad(true));
        b[i].push_back(uniform({n}, -0.1, 0.1, seed++, opt).set_requires_grad(true));
      }
    }
    x = randn({bsz, n}, seed++, opt);
    target = randn({bsz, n}, seed++, opt);
  }
  // Forward with branch i on streams[i] (empty: everything on the current stream).
  Tensor loss(const std::vector<Stream*>& streams = {}) const {
    Tensor sum_out;
    for (int i = 0; i < branches; ++i) {
      std::unique_ptr<StreamGuard> g;
      if (!streams.empty()) g = std::make_unique<StreamGuard>(*streams[i]);
      Tensor h = x;
      for (int j = 0; j < depth; ++j) h = relu(linear(h, w[i][j], b[i][j]));
      g.reset();
      sum_out = sum_out.defined() ? add(sum_out, h) : h;
    }
    return mse_loss(sum_out, target);
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> out;
    for (int i = 0; i < branches; ++i) {
      for (int j = 0; j < depth; ++j) {
        out.push_back(w[i][j].grad().to_vector<float>());
        out.push_back(b[i][j].grad().to_vector<float>());
      }
    }
    return out;
  }
  void clear_grads() {
    for (auto& layer : w)
      for (auto& t : layer) t.grad() = Tensor();
    for (auto& layer : b)
      for (auto& t : layer) t.grad() = Tensor();
  }
};

// k streams of the GPU, and pointers to them for BranchModel::loss.
struct BranchStreams {
  std::vector<Stream> owned;
  std::vector<Stream*> ptrs;
  explicit BranchStreams(int k) {
    owned.reserve(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) owned.emplace_back(kGpu);
    for (Stream& s : owned) ptrs.push_back(&s);
  }
  BranchStreams(const BranchStreams&) = delete;
  BranchStreams& operator=(const BranchStreams&) = delete;
};

TEST_F(CudaAutograd, MultistreamBackwardEqualsSingleStreamBitwise) {
  BranchModel m(4, 8, 256, 64, kF32Gpu);
  backward(m.loss());
  const auto single = m.grads();
  m.clear_grads();
  const BranchStreams owned(4);
  const std::vector<Stream*>& streams = owned.ptrs;
  for (int rep = 0; rep < 3; ++rep) {
    backward(m.loss(streams),
             {.grad_write = GradWrite::kOverwrite, .streams = EagerStreams::kForward});
    EXPECT_EQ(m.grads(), single) << "repetition " << rep;
  }
  // On the caller's stream alone (the default for a backward this short): the same bits.
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<StepTiming> trace;
    backward(m.loss(streams), {.grad_write = GradWrite::kOverwrite, .timings = &trace});
    for (const StepTiming& t : trace) ASSERT_EQ(t.stream, 0) << t.label;
    EXPECT_EQ(m.grads(), single) << "repetition " << rep;
  }
}

TEST_F(CudaAutograd, SplitWeightGradientsOnSideStreamsEqualTheSingleStreamBackwardBitwise) {
  // Weight-gradient parallelism moves each layer's dW/db onto a side stream; with the forward on
  // four streams the backward then uses eight. The gradients must not change by a bit.
  BranchModel m(4, 8, 256, 64, kF32Gpu);
  backward(m.loss());
  const auto single = m.grads();
  m.clear_grads();
  const BranchStreams owned(4);
  const std::vector<Stream*>& streams = owned.ptrs;
  const BackwardPlan plan =
      plan_for({m.loss(streams)}, GradWrite::kOverwrite, {.split_weight_grads = true});
  EXPECT_EQ(plan.streams.size(), 9u) << plan.dump();  // caller, 4 branch streams, 4 side streams
  for (int rep = 0; rep < 3; ++rep) {
    backward(m.loss(streams), {.grad_write = GradWrite::kOverwrite, .split_weight_grads = true});
    EXPECT_EQ(m.grads(), single) << "repetition " << rep;
  }
}

TEST_F(CudaAutograd, GpuGradientsMatchTheCpuBackend) {
  BranchModel gpu(2, 3, 67, 33, kF32Gpu);
  BranchModel cpu(2, 3, 67, 33, {});
  backward(gpu.loss());
  backward(cpu.loss());
  const auto g = gpu.grads(), c = cpu.grads();
  ASSERT_EQ(g.size(), c.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_LT(rel_error(std::vector<double>(g[i].begin(), g[i].end()),
                        std::vector<double>(c[i].begin(), c[i].end())),
              1e-4)
        << "parameter " << i;
  }
}

TEST_F(CudaAutograd, BackwardRunsOnTheStreamsTheForwardUsed) {
  BranchModel m(2, 4, 128, 32, kF32Gpu);
  Stream s0(kGpu), s1(kGpu);
  const Tensor loss = m.loss({&s0, &s1});
  const BackwardPlan plan = plan_for({loss});
  int on_branch_stream[2] = {0, 0};
  for (const auto& step : plan.steps) {
    EXPECT_EQ(plan.streams[step.stream], step.node->stream()) << step.node->label();
    on_branch_stream[0] += step.node->stream() == s0.get();
    on_branch_stream[1] += step.node->stream() == s1.get();
  }
  EXPECT_EQ(on_branch_stream[0], 8);  // 4 x (linear, relu)
  EXPECT_EQ(on_branch_stream[1], 8);
  // Each branch's first step waits for the loss's on the caller's stream: no fork needed.
  EXPECT_TRUE(plan.forks.empty());
  EXPECT_EQ(plan.joins.size(), 2u);
  std::vector<StepTiming> trace;
  backward(loss, {.timings = &trace, .streams = EagerStreams::kForward});
  // The event-timed trace: one entry per step, on the plan's streams, in stream order.
  ASSERT_EQ(trace.size(), plan.steps.size());
  std::map<int, float> last_end;
  for (const StepTiming& t : trace) {
    EXPECT_EQ(t.stream, plan.steps[t.step].stream);
    EXPECT_EQ(t.label, plan.steps[t.step].node->label());
    EXPECT_GE(t.start_ms, 0.0f);
    EXPECT_GE(t.end_ms, t.start_ms);
    if (last_end.count(t.stream)) {
      EXPECT_GE(t.start_ms, last_end[t.stream]) << t.label;
    }
    last_end[t.stream] = t.end_ms;
  }
  EXPECT_EQ(last_end.size(), 3u) << "the caller's stream and the two branch streams";
  // Leaf gradients were written on the stream of the node that produced them (rule [leaf
  // gradients]).
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(m.w[0][j].grad().storage()->producer_stream(), s0.get());
    EXPECT_EQ(m.w[1][j].grad().storage()->producer_stream(), s1.get());
  }
}

TEST_F(CudaAutograd, GradientsAreReadableOnTheCallersStreamRightAfterBackward) {
  // The whole forward and backward run on a side stream, behind a chain of 2048³ GEMMs; backward
  // is called on `caller`. Reading the gradient on `caller` right after backward(), with rule [read
  // after write]'s automatic waits switched off (PlannedSyncScope), is correct only if backward
  // joined the side stream into the caller's stream (rule [fork and join]).
  Stream side(kGpu), caller(kGpu);
  const Tensor w = mul(randn({2048, 2048}, 1, kF32Gpu), 1.0 / 45.0).set_requires_grad(true);
  const Tensor x = mul(randn({2048, 2048}, 2, kF32Gpu), 1.0 / 45.0);
  Tensor loss;
  {
    StreamGuard g(side);
    Tensor h = x;
    for (int i = 0; i < 6; ++i) h = matmul(h, w);
    loss = mean(h);
  }
  Tensor seen;
  {
    StreamGuard g(caller);
    backward(loss);
    PlannedSyncScope no_automatic_waits;
    seen = w.grad().clone();  // on `caller`, ordered only by the join
  }
  caller.synchronize();
  side.synchronize();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(seen.to_vector<float>(), w.grad().to_vector<float>());
}

TEST_F(CudaAutograd, SharedGradientIsNotOverwrittenWhileAnotherStreamStillReadsIt) {
  // add() passes its gradient to both operands without a copy (GradSlot::may_share), so the two
  // branches' relu steps, on two streams, read one buffer. The second of them holds the last
  // handle to it, but the first — on a stream kept busy here by a 2048³ GEMM chain — may not have
  // read it yet on the GPU: writing the relu gradient in place there would corrupt the other
  // branch's gradient. Bitwise equality with the single-stream backward catches it.
  Stream s0(kGpu), s1(kGpu);
  const Tensor w0 = uniform({256, 256}, -0.06, 0.06, 1, kF32Gpu).set_requires_grad(true);
  const Tensor w1 = uniform({256, 256}, -0.06, 0.06, 2, kF32Gpu).set_requires_grad(true);
  const Tensor x = randn({64, 256}, 3, kF32Gpu), target = randn({64, 256}, 4, kF32Gpu);
  const Tensor big0 = mul(randn({2048, 2048}, 5, kF32Gpu), 1.0 / 45.0);
  auto loss_on = [&](Stream* a, Stream* b) {
    Tensor h0, h1;
    {
      std::optional<StreamGuard> g;
      if (a) g.emplace(*a);
      h0 = relu(linear(x, w0));
    }
    {
      std::optional<StreamGuard> g;
      if (b) g.emplace(*b);
      h1 = relu(linear(x, w1));
    }
    return mse_loss(add(h0, h1), target);
  };
  backward(loss_on(nullptr, nullptr));
  const std::vector<float> ref0 = w0.grad().to_vector<float>(), ref1 = w1.grad().to_vector<float>();
  for (int rep = 0; rep < 2; ++rep) {
    const Tensor loss = loss_on(&s0, &s1);
    // The relu step the plan runs first is the reader that must not be overtaken: delay its stream.
    const BackwardPlan plan = plan_for({loss});
    int first_relu = -1;
    for (std::size_t i = 0; i < plan.steps.size() && first_relu < 0; ++i) {
      if (plan.steps[i].node->name() == "relu") first_relu = static_cast<int>(i);
    }
    ASSERT_GE(first_relu, 0) << plan.dump();
    const cudaStream_t reader = plan.streams[plan.steps[first_relu].stream];
    ASSERT_TRUE(reader == s0.get() || reader == s1.get()) << plan.dump();
    {
      StreamGuard g(kGpu, reader);
      Tensor busy = big0;
      for (int i = 0; i < 6; ++i) busy = matmul(busy, busy);
    }
    backward(loss, {.grad_write = GradWrite::kOverwrite, .streams = EagerStreams::kForward});
    EXPECT_EQ(w0.grad().to_vector<float>(), ref0) << "repetition " << rep;
    EXPECT_EQ(w1.grad().to_vector<float>(), ref1) << "repetition " << rep;
  }
}

TEST_F(CudaAutograd, SeedProducedOnAnotherStreamIsWaitedFor) {
  Stream other(kGpu);
  const Tensor w = randn({512, 512}, 1, kF32Gpu).set_requires_grad(true);
  const Tensor y = mul(w, 2.0);
  Tensor seed;
  {
    StreamGuard g(other);
    Tensor big = mul(randn({2048, 2048}, 3, kF32Gpu), 1.0 / 45.0);
    for (int i = 0; i < 4; ++i) big = matmul(big, big);  // keep `other` busy
    seed = full({512, 512}, 0.5, kF32Gpu);
  }
  backward({y}, {seed});
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(512 * 512, 1.0f));
}

// ---- Note [Streams of an eager backward] (engine/backward/backward_plan.h) -----------------------------

// The review's sweep: two parallel linear+relu layers on an n × n input, on two streams, summed
// into an mse loss on the caller's stream.
struct TwoLinears {
  Tensor x, t, w0, w1;
  explicit TwoLinears(std::int64_t n)
      : x(randn({n, n}, 1, kF32Gpu)),
        t(randn({n, n}, 2, kF32Gpu)),
        w0(mul(randn({n, n}, 3, kF32Gpu), 1.0 / std::sqrt(static_cast<double>(n)))),
        w1(mul(randn({n, n}, 4, kF32Gpu), 1.0 / std::sqrt(static_cast<double>(n)))) {
    w0.set_requires_grad(true);
    w1.set_requires_grad(true);
  }
  Tensor loss(Stream& s0, Stream& s1) const {
    Tensor h0, h1;
    {
      StreamGuard g(s0);
      h0 = linear(x, w0, Tensor(), Activation::kRelu);
    }
    {
      StreamGuard g(s1);
      h1 = linear(x, w1, Tensor(), Activation::kRelu);
    }
    return mse_loss(add(h0, h1), t);
  }
  std::vector<std::vector<float>> grads() const {
    return {w0.grad().to_vector<float>(), w1.grad().to_vector<float>()};
  }
};

std::set<int> streams_of(const std::vector<StepTiming>& trace) {
  std::set<int> s;
  for (const StepTiming& t : trace) s.insert(t.stream);
  return s;
}

TEST_F(CudaAutograd, ABackwardTooShortForStreamsRunsOnTheCallersStreamWithTheSameBits) {
  Stream s0(kGpu), s1(kGpu);
  for (std::int64_t n : {64, 256}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const TwoLinears m(n);
    std::vector<StepTiming> trace;
    backward(m.loss(s0, s1), {.timings = &trace, .streams = EagerStreams::kForward});
    EXPECT_EQ(streams_of(trace).size(), 3u) << "kForward: the caller's and both branches'";
    const auto want = m.grads();
    for (int rep = 0; rep < 3; ++rep) {
      trace.clear();
      backward(m.loss(s0, s1), {.grad_write = GradWrite::kOverwrite, .timings = &trace});
      EXPECT_EQ(streams_of(trace), std::set<int>{0}) << "repetition " << rep;
      EXPECT_EQ(m.grads(), want) << "repetition " << rep;
    }
    // Untimed, as training runs it.
    backward(m.loss(s0, s1), {.grad_write = GradWrite::kOverwrite});
    EXPECT_EQ(m.grads(), want);
  }
}

TEST_F(CudaAutograd, ABackwardLongEnoughForStreamsKeepsThem) {
  Stream s0(kGpu), s1(kGpu);
  const TwoLinears m(1024);  // two 1024³ weight-gradient products: far longer than 4 launches
  std::vector<StepTiming> trace;
  backward(m.loss(s0, s1), {.timings = &trace});
  EXPECT_EQ(streams_of(trace).size(), 3u);
}

TEST_F(CudaAutograd, ABackwardMovedToTheCallersStreamWaitsForARootMadeElsewhere) {
  // The forward and its loss on `side`, behind a stall; backward() called on `caller`. Moved onto
  // `caller`, the backward must first wait for `side`, or it reads the activations before they
  // exist. Read right after backward() on `caller` with rule [read after write]'s waits switched
  // off.
  Stream side(kGpu), caller(kGpu), s1(kGpu);
  const TwoLinears m(64);
  std::vector<std::vector<float>> want;
  {
    StreamGuard g(caller);
    Tensor loss;
    {
      StreamGuard on_side(side);
      loss = m.loss(side, s1);
    }
    backward(loss, {.grad_write = GradWrite::kOverwrite, .streams = EagerStreams::kForward});
    want = m.grads();
  }
  for (int rep = 0; rep < 2; ++rep) {
    Tensor loss;
    {
      StreamGuard on_side(side);
      testing::stall(side.get(), 100);
      // The loss (made on `side`) adds the branches: one of them on `side` itself.
      loss = m.loss(side, s1);
    }
    std::vector<StepTiming> trace;
    Tensor seen0, seen1;
    {
      StreamGuard g(caller);
      backward(loss, {.grad_write = GradWrite::kOverwrite, .timings = rep == 0 ? &trace : nullptr});
      PlannedSyncScope no_automatic_waits;
      seen0 = m.w0.grad().clone();
      seen1 = m.w1.grad().clone();
    }
    if (rep == 0) {
      EXPECT_EQ(streams_of(trace), std::set<int>{0});
    }
    caller.synchronize();
    EXPECT_EQ(seen0.to_vector<float>(), want[0]) << "repetition " << rep;
    EXPECT_EQ(seen1.to_vector<float>(), want[1]) << "repetition " << rep;
  }
}

}  // namespace
}  // namespace graphward
