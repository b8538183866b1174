// The captured backward, Google Benchmark:
//   GraphBackward/<study>    BackwardGraph replaying the backward of docs/DESIGN.md's studies:
//                            wall time (backward() + synchronize, forward untimed, medians), gpu_us
//                            (the GPU's execution alone: GpuTimer, median of 101) and host_us (the
//                            whole backward() call: signature check, launch and the release of the
//                            step's saved tensors after it); fwd_host_us the untimed forward's
//                            host time; captures and updates must stay 0 in steady state.
//   HandWrittenGraph/<study> the same kernels as graphward's backward (relu backward, dX GEMM, dW
//                            GEMM with db fused, the mse backward), captured by hand into one CUDA
//                            graph (one stream, a stream per branch, or also side streams for the
//                            weight gradients) and replayed: the figures to be within 1.05x of.
//   Signature/<nodes>        a signature by a walk of the tape alone on a K x D model (host time;
//                            GraphBackward's sig_us is the one from the tape log that replays use).
// Side by side with PyTorch's captured backward: scripts/compare_torch.py --graph.
//
//   graphward_bench_capture --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <cmath>
#include <memory>
#include <vector>

#include "bench/bench_models.h"
#include "graphward/capture/backward_graph.h"
#include "graphward/capture/signature.h"

namespace gw = graphward;

namespace {

using gw::bench::kDev;
using gw::bench::kF32;
using gw::bench::skip_without_gpu;
using Model = gw::bench::BranchModel;

// With GW_DOT_DIR set, each benchmark writes its captured graph there as Graphviz DOT
// (<kind>_<args>.dot), for reading the graphs' shapes side by side.
std::string dot_path(const std::string& kind, const benchmark::State& state) {
  const char* dir = std::getenv("GW_DOT_DIR");
  if (!dir || !*dir) return "";
  std::string name = std::string(dir) + "/" + kind;
  for (int i = 0; i < 5; ++i) name += "_" + std::to_string(state.range(i));
  return name + ".dot";
}
void dump_dot(const gw::BackwardGraph& bw, const std::string& kind, const benchmark::State& state) {
  const std::string path = dot_path(kind, state);
  if (!path.empty()) bw.write_dot(path);
}

void graph_backward(benchmark::State& state, bool split) {
  if (skip_without_gpu(state)) return;
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  Model m(k, d, state.range(2), state.range(3), state.range(4) != 0);
  const cudaStream_t caller = gw::current_stream(kDev);
  gw::StepArena arena(kDev);
  gw::BackwardGraph bw(kDev, {.backward = {.split_weight_grads = split}});
  double fwd_host = 0;  // the forward's host time (its arena slots' waits included)
  auto step = [&](bool timed, double* host) {
    gw::StepScope scope(arena);
    const auto f0 = std::chrono::steady_clock::now();
    const gw::Tensor loss = m.loss();
    if (timed) fwd_host += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - f0).count();
    GW_CUDA_CHECK(cudaStreamSynchronize(caller));
    for (auto& s : m.streams) s->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    bw.backward(loss, gw::GradWrite::kOverwrite);
    const auto t1 = std::chrono::steady_clock::now();
    arena.record_step_end(caller);
    GW_CUDA_CHECK(cudaStreamSynchronize(caller));
    const auto t2 = std::chrono::steady_clock::now();
    if (timed) {
      *host += std::chrono::duration<double>(t1 - t0).count();
      state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
    }
  };
  double unused = 0;
  for (int i = 0; i < 5; ++i) step(false, &unused);  // warm-up, capture, first replays
  const auto before = bw.stats().counters;
  double host = 0;
  gw::BackwardHostTimes parts;
  double whole_steps = 0;  // replays that released their step as a whole
  for (auto _ : state) {
    step(true, &host);
    const gw::BackwardHostTimes t = bw.stats().host;
    parts.signature_us += t.signature_us;
    parts.wait_us += t.wait_us;
    parts.decide_us += t.decide_us;
    parts.refresh_us += t.refresh_us;
    parts.launch_us += t.launch_us;
    parts.release_us += t.release_us;
    whole_steps += t.whole_step;
  }
  // The GPU's execution alone (GpuTimer): the same steps, each backward enqueued behind a hold
  // (the forward first, outside the timing: the hold is on the caller's stream).
  gw::bench::GpuTimer timer(kDev);
  std::vector<double> gpu;
  for (int i = 0; i < 101; ++i) {
    gw::StepScope scope(arena);
    const gw::Tensor loss = m.loss();
    GW_CUDA_CHECK(cudaStreamSynchronize(caller));
    for (auto& s : m.streams) s->synchronize();
    gpu.push_back(timer.time_us(caller, [&] {
      bw.backward(loss, gw::GradWrite::kOverwrite);
      arena.record_step_end(caller);
    }));
  }
  state.counters["gpu_us"] = gw::bench::GpuTimer::median(gpu);
  if (timer.timed_out()) state.SkipWithError("GpuTimer: the hold timed out");
  const double iters = static_cast<double>(state.iterations());
  const gw::BackwardGraphStats st = bw.stats();
  state.counters["sig_us"] = parts.signature_us / iters;
  state.counters["from_log"] = st.signature_from_log;  // Note [Tape log]
  state.counters["fwd_match"] = st.matched_in_forward;
  state.counters["wait_us"] = parts.wait_us / iters;
  state.counters["decide_us"] = parts.decide_us / iters;
  state.counters["refresh_us"] = parts.refresh_us / iters;
  state.counters["launch_us"] = parts.launch_us / iters;
  state.counters["release_us"] = parts.release_us / iters;
  state.counters["whole_step"] = whole_steps / iters;  // Note [Reads of a replayed step]
  const auto& after = st.counters;
  state.counters["host_us"] = 1e6 * host / static_cast<double>(state.iterations());
  state.counters["fwd_host_us"] = fwd_host / iters;
  state.counters["captures"] = static_cast<double>(after.captures - before.captures);
  state.counters["updates"] = static_cast<double>(after.updates - before.updates);
  state.counters["kernel_nodes"] = static_cast<double>(st.graph.kernel_nodes);
  state.counters["tape_nodes"] = static_cast<double>(st.graph.tape_nodes);
  state.counters["graph_mem_kib"] = static_cast<double>(st.graph.memory_bytes) / 1024;
  state.counters["memory_nodes"] = static_cast<double>(st.graph.memory_nodes);
  state.counters["graph_nodes"] = static_cast<double>(st.graph.kernel_nodes + st.graph.other_nodes);
  dump_dot(bw, split ? "graphward_split" : "graphward", state);
  state.SetLabel(st.signature_from_log ? st.reason : std::string("walked: ") + st.walk_reason);
}
void BM_GraphBackward(benchmark::State& state) {
  graph_backward(state, false);
}
// With weight-gradient parallelism (each layer's dW/db on a side stream).
void BM_GraphBackwardSplit(benchmark::State& state) {
  graph_backward(state, true);
}
BENCHMARK(BM_GraphBackwardSplit)->Name("GraphBackwardSplit")->Apply([](auto* b) {
  gw::bench::studies(b, /*side_streams_only=*/true);
});
BENCHMARK(BM_GraphBackward)->Name("GraphBackward")->Apply([](auto* b) { gw::bench::studies(b); });
// The host cost of replaying a ~200-node tape (4 branches x 24 layers + the adds and the loss:
// 196 nodes), narrow so that the GPU time stays short; sig_us + decide_us + launch_us is the
// "signature check + launch" figure.
BENCHMARK(BM_GraphBackward)
    ->Name("GraphBackwardHost")
    ->ArgNames({"branches", "depth", "width", "batch", "multistream"})
    ->Args({4, 24, 64, 16, 0})
    ->Args({4, 24, 64, 16, 1})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// The hand-written graph: graphward's backward kernels, launched by hand on preallocated buffers
// inside one stream capture, on one stream, on a stream per branch, or with each branch's weight
// gradients on a side stream as well (`streams` 0 / 1 / 2).
void BM_HandWrittenGraph(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const std::int64_t n = state.range(2), batch = state.range(3);
  Model m(k, d, n, batch, false);
  gw::Stream stream(kDev);
  const cudaStream_t s = stream.get();
  const gw::bench::HandWrittenBackward hand(m, s);
  // streams: 0 one stream; 1 a stream per branch; 2 and each branch's dW/db GEMMs on a side stream
  const int mode = static_cast<int>(state.range(4));
  std::vector<std::unique_ptr<gw::Stream>> owned;
  std::vector<cudaStream_t> branch, side;
  for (int i = 0; i < k && mode >= 1; ++i) {
    owned.push_back(std::make_unique<gw::Stream>(kDev));
    branch.push_back(owned.back()->get());
    if (mode == 2) {
      owned.push_back(std::make_unique<gw::Stream>(kDev));
      side.push_back(owned.back()->get());
    }
  }
  auto backward = [&] { hand.launch(branch, side); };
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  backward();  // GEMM plans and handles outside the capture
  stream.synchronize();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GW_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  backward();
  GW_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  GW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 5; ++i) GW_CUDA_CHECK(cudaGraphLaunch(exec, s));
  stream.synchronize();
  gw::StepArena arena(kDev);
  double host = 0;
  for (auto _ : state) {
    // Timed where graph_backward times graphward's backward: right after a step's forward (its
    // kernels done), not back to back with the previous backward, whose buffers, clocks and
    // driver state a loop of launches alone would find warm.
    gw::StepScope scope(arena);
    const gw::Tensor loss = m.loss();
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    GW_CUDA_CHECK(cudaGraphLaunch(exec, s));
    const auto t1 = std::chrono::steady_clock::now();
    stream.synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    host += std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  state.counters["host_us"] = 1e6 * host / static_cast<double>(state.iterations());
  gw::bench::GpuTimer timer(kDev);  // the GPU's execution alone, as GraphBackward's gpu_us
  state.counters["gpu_us"] =
      timer.median_us(s, 101, [&] { GW_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  if (timer.timed_out()) state.SkipWithError("GpuTimer: the hold timed out");
  std::size_t nodes = 0;
  GW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  if (const std::string path = dot_path("hand", state); !path.empty()) {
    GW_CUDA_CHECK(cudaGraphDebugDotPrint(graph, path.c_str(), 0));
  }
  state.counters["graph_nodes"] = static_cast<double>(nodes);
  GW_CUDA_CHECK(cudaGraphExecDestroy(exec));
  GW_CUDA_CHECK(cudaGraphDestroy(graph));
}
BENCHMARK(BM_HandWrittenGraph)
    ->Name("HandWrittenGraph")
    ->ArgNames({"branches", "depth", "width", "batch", "streams"})
    ->Args({4, 8, 256, 64, 0})
    ->Args({4, 8, 256, 64, 1})
    ->Args({4, 8, 256, 64, 2})
    ->Args({1, 32, 256, 64, 0})
    ->Args({1, 32, 256, 64, 2})
    ->Args({4, 4, 1024, 256, 0})
    ->Args({4, 4, 1024, 256, 1})
    ->Args({4, 4, 1024, 256, 2})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// tape_signature() alone, into reused buffers, on K branches x D layers (~2·K·D nodes).
void BM_Signature(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Model m(4, static_cast<int>(state.range(0)), 16, 8, true);
  for (auto& layer : m.w)
    for (auto& t : layer) t.grad() = gw::zeros(t.shape(), kF32);
  for (auto& layer : m.b)
    for (auto& t : layer) t.grad() = gw::zeros(t.shape(), kF32);
  const gw::Tensor loss = m.loss();
  const std::vector<gw::Tensor> roots{loss}, seeds{gw::ones({}, kF32)};
  gw::capture::TapeSignature sig, first;
  gw::capture::tape_signature(first, roots, seeds, gw::current_stream(kDev),
                              gw::GradWrite::kOverwrite);
  for (auto _ : state) {
    gw::capture::tape_signature_walk(sig, roots, seeds, gw::current_stream(kDev),
                                gw::GradWrite::kOverwrite);
    benchmark::DoNotOptimize(sig.same_structure(first) && sig.same_addresses(first));
  }
  state.counters["nodes"] = first.num_nodes();
  state.counters["words"] = static_cast<double>(first.structure.size());
}
BENCHMARK(BM_Signature)->Name("Signature")->ArgName("depth")->Arg(8)->Arg(24)->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
