// Eager backward (Google Benchmark): the K-branch x D-layer study of docs/DESIGN.md (linear N +
// relu, batch B, branch outputs summed, mse loss), single stream and one stream per branch.
//
// Per iteration (forward untimed): t0; backward(); t1; synchronize; t2. The manual time is t2 - t0
// (the backward's wall time with a synchronize, the figure docs/DESIGN.md's tables use); the
// counter host_us is t1 - t0 (host time of the backward() call) and host_us_per_node divides it by
// the nodes run. PlanOnly times plan_for() alone: the cost of planning, paid every eager step.
//
//   graphward_bench_autograd --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_models.h"

namespace gw = graphward;

namespace {

using gw::bench::kDev;
using gw::bench::kF32;
using Model = gw::bench::BranchModel;

void eager_backward(benchmark::State& state, bool keep_graph, bool split = false) {
  if (!gw::cuda_available()) {
    state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
    return;
  }
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const std::int64_t n = state.range(2), batch = state.range(3);
  const bool multi = state.range(4) != 0;
  Model m(k, d, n, batch, multi);
  const cudaStream_t caller = gw::current_stream(kDev);
  for (int i = 0; i < 5; ++i) {
    gw::backward(m.loss(), {.grad_write = gw::GradWrite::kOverwrite, .split_weight_grads = split});
  }
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  double host_total = 0;
  std::size_t nodes = gw::plan_for({m.loss()}).steps.size();
  for (auto _ : state) {
    const gw::Tensor loss = m.loss();
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    gw::backward(loss, {.retain_graph = keep_graph,
                        .grad_write = gw::GradWrite::kOverwrite,
                        .split_weight_grads = split});
    const auto t1 = std::chrono::steady_clock::now();
    GW_CUDA_CHECK(cudaStreamSynchronize(caller));
    const auto t2 = std::chrono::steady_clock::now();
    host_total += std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["host_us"] = 1e6 * host_total / iters;
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["host_us_per_node"] = 1e6 * host_total / iters / static_cast<double>(nodes);
}
void BM_EagerBackward(benchmark::State& state) {
  eager_backward(state, false);
}
// With retain_graph: releasing the saved tensors is left out of the timing (the graph is freed when
// the loss goes out of scope, untimed).
void BM_EagerBackwardKeepGraph(benchmark::State& state) {
  eager_backward(state, true);
}
// With weight-gradient parallelism (each layer's dW/db on a side stream; not yet measured).
void BM_EagerBackwardSplit(benchmark::State& state) {
  eager_backward(state, false, true);
}

// args: branches, depth, width, batch, multistream
BENCHMARK(BM_EagerBackward)->Name("EagerBackward")->Apply([](auto* b) { gw::bench::studies(b); });
BENCHMARK(BM_EagerBackwardSplit)->Name("EagerBackwardSplit")->Apply([](auto* b) {
  gw::bench::studies(b, /*side_streams_only=*/true);
});
BENCHMARK(BM_EagerBackwardKeepGraph)
    ->Name("EagerBackwardKeepGraph")
    ->ArgNames({"branches", "depth", "width", "batch", "multistream"})
    ->Args({4, 8, 256, 64, 0})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// The hand-written launch floor of the same backward: the same kernels as graphward's backward
// (relu backward, cuBLASLt GEMMs for dX, dW with db fused, the mse backward), launched directly on
// preallocated buffers in the same order on one stream, with no autograd, no allocation and no
// copies (the branches read the loss gradient directly). EagerBackward / this = graphward's
// overhead.
void BM_HandWrittenBackward(benchmark::State& state) {
  if (gw::bench::skip_without_gpu(state)) return;
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  Model m(k, d, state.range(2), state.range(3), false);
  const cudaStream_t s = gw::current_stream(kDev);
  const gw::bench::HandWrittenBackward hand(m, s);
  auto backward = [&] { hand.launch(); };
  for (int i = 0; i < 5; ++i) backward();
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  double host_total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    backward();
    const auto t1 = std::chrono::steady_clock::now();
    GW_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto t2 = std::chrono::steady_clock::now();
    host_total += std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  state.counters["host_us"] = 1e6 * host_total / static_cast<double>(state.iterations());
}
BENCHMARK(BM_HandWrittenBackward)
    ->Name("HandWrittenBackward")
    ->ArgNames({"branches", "depth", "width", "batch"})
    ->Args({4, 8, 256, 64})
    ->Args({1, 32, 256, 64})
    ->Args({4, 4, 1024, 256})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// The host time of backward() alone: one forward, then backward with retain_graph again and again
// (the stream synchronized every 16 calls, untimed, so the queue never fills). No forward runs
// between the backwards, so this is also the loop to profile the backward's host path with.
void BM_EagerBackwardRetained(benchmark::State& state) {
  if (!gw::cuda_available()) {
    state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
    return;
  }
  Model m(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 256, 64, false);
  const cudaStream_t caller = gw::current_stream(kDev);
  const gw::Tensor loss = m.loss();
  const gw::BackwardOptions opts{.retain_graph = true, .grad_write = gw::GradWrite::kOverwrite};
  for (int i = 0; i < 5; ++i) gw::backward(loss, opts);
  GW_CUDA_CHECK(cudaStreamSynchronize(caller));
  std::int64_t n = 0;
  for (auto _ : state) {
    gw::backward(loss, opts);
    if (++n % 16 == 0) {
      state.PauseTiming();
      GW_CUDA_CHECK(cudaStreamSynchronize(caller));
      state.ResumeTiming();
    }
  }
  GW_CUDA_CHECK(cudaStreamSynchronize(caller));
  state.counters["nodes"] = static_cast<double>(gw::plan_for({loss}).steps.size());
}
BENCHMARK(BM_EagerBackwardRetained)
    ->Name("EagerBackwardRetained")
    ->ArgNames({"branches", "depth"})
    ->Args({4, 8})
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// Where the eager backward's host time goes, per kind of node: a traced backward (StepTiming's
// host_us) after a fresh forward, as in EagerBackward. Counters: mean host µs per step of each op,
// and the sum over all steps (the rest of a backward is planning, seeds, fork/join and releasing
// the graph). Tracing adds two event records per step.
void BM_EagerBackwardTrace(benchmark::State& state) {
  if (!gw::cuda_available()) {
    state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
    return;
  }
  Model m(4, 8, 256, 64, false);
  std::map<std::string, std::pair<double, int>> per_op;  // name -> (total µs, steps)
  double steps_total = 0;
  std::vector<gw::StepTiming> trace;
  for (int i = 0; i < 5; ++i) gw::backward(m.loss(), {.grad_write = gw::GradWrite::kOverwrite});
  for (auto _ : state) {
    const gw::Tensor loss = m.loss();
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    gw::backward(loss, {.grad_write = gw::GradWrite::kOverwrite, .timings = &trace});
    for (const gw::StepTiming& t : trace) {
      auto& [total, count] = per_op[t.label.substr(0, t.label.find('#'))];
      total += t.host_us;
      ++count;
      steps_total += t.host_us;
    }
  }
  for (const auto& [name, tc] : per_op) state.counters[name + "_us"] = tc.first / tc.second;
  state.counters["steps_total_us"] = steps_total / static_cast<double>(state.iterations());
}
BENCHMARK(BM_EagerBackwardTrace)->Name("EagerBackwardTrace/4x8")->MinTime(0.3);

void BM_PlanOnly(benchmark::State& state) {
  if (!gw::cuda_available()) {
    state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
    return;
  }
  Model m(4, 8, 256, 64, true);
  const gw::Tensor loss = m.loss();
  for (auto _ : state) benchmark::DoNotOptimize(gw::plan_for({loss}));
  state.counters["nodes"] = static_cast<double>(gw::plan_for({loss}).steps.size());
}
BENCHMARK(BM_PlanOnly)->Name("PlanOnly/4x8")->MinTime(0.2)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
