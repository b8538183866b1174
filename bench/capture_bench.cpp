// The captured backward (capture issue), Google Benchmark:
//   GraphBackward/<study>    BackwardGraph replaying the backward of DESIGN.md's studies: wall time
//                            (backward() + synchronize, forward untimed, medians) and host_us (the
//                            backward() call: signature check + launch); captures and updates must
//                            stay 0 in steady state (counters).
//   HandWrittenGraph/<study> the same kernels as graphward's backward (relu backward, dX GEMM, dW
//                            GEMM with db fused, the mse backward), captured by hand into one CUDA
//                            graph on one stream and replayed: the figure to be within 1.05x of.
//   Signature/<nodes>        tape_signature() alone on a K x D model (host time).
// Side by side with PyTorch's captured backward: scripts/compare_torch.py --graph.
//
//   graphward_bench_capture --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// STATUS (2026-11-30): written and compiled; not yet run on a GPU.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "capture/backward_graph.h"
#include "capture/signature.h"
#include "engine/blas.h"
#include "engine/graphward.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace gw = graphward;

namespace {

constexpr gw::Device kDev = gw::Device::cuda(0);
constexpr gw::TensorOptions kF32{gw::DType::kFloat32, kDev};

bool skip_without_gpu(benchmark::State& state) {
  if (gw::cuda_available()) return false;
  state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
  return true;
}

struct Model {
  std::vector<std::vector<gw::Tensor>> w, b;
  gw::Tensor x, target;
  std::vector<std::unique_ptr<gw::Stream>> streams;
  Model(int k, int d, std::int64_t n, std::int64_t batch, bool multistream) {
    std::uint64_t seed = 1;
    const double s = 1.0 / std::sqrt(double(n));
    w.resize(k);
    b.resize(k);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) {
        w[i].push_back(gw::uniform({n, n}, -s, s, seed++, kF32).set_requires_grad(true));
        b[i].push_back(gw::uniform({n}, -0.1, 0.1, seed++, kF32).set_requires_grad(true));
      }
      if (multistream) streams.push_back(std::make_unique<gw::Stream>(kDev));
    }
    x = gw::randn({batch, n}, seed++, kF32);
    target = gw::randn({batch, n}, seed++, kF32);
  }
  gw::Tensor loss() const {
    gw::Tensor total;
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::unique_ptr<gw::StreamGuard> g;
      if (!streams.empty()) g = std::make_unique<gw::StreamGuard>(*streams[i]);
      gw::Tensor h = x;
      for (std::size_t j = 0; j < w[i].size(); ++j) h = gw::relu(gw::linear(h, w[i][j], b[i][j]));
      g.reset();
      total = total.defined() ? gw::add(total, h) : h;
    }
    return gw::mse_loss(total, target);
  }
};

void graph_backward(benchmark::State& state, bool split) {
  if (skip_without_gpu(state)) return;
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  Model m(k, d, state.range(2), state.range(3), state.range(4) != 0);
  const cudaStream_t caller = gw::current_stream(kDev);
  gw::StepArena arena(kDev);
  gw::BackwardGraph bw(kDev, {.split_weight_grads = split});
  auto step = [&](bool timed, double* host) {
    gw::StepScope scope(arena);
    const gw::Tensor loss = m.loss();
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
  const auto before = bw.counters();
  double host = 0;
  for (auto _ : state) step(true, &host);
  const auto after = bw.counters();
  state.counters["host_us"] = 1e6 * host / static_cast<double>(state.iterations());
  state.counters["captures"] = static_cast<double>(after.captures - before.captures);
  state.counters["updates"] = static_cast<double>(after.updates - before.updates);
  state.counters["kernel_nodes"] = static_cast<double>(bw.last_graph_stats().kernel_nodes);
  state.counters["graph_nodes"] =
      static_cast<double>(bw.last_graph_stats().kernel_nodes + bw.last_graph_stats().other_nodes);
  state.SetLabel(bw.last_reason());
}
void BM_GraphBackward(benchmark::State& state) {
  graph_backward(state, false);
}
// With weight-gradient parallelism (each layer's dW/db on a side stream).
void BM_GraphBackwardSplit(benchmark::State& state) {
  graph_backward(state, true);
}
BENCHMARK(BM_GraphBackwardSplit)
    ->Name("GraphBackwardSplit")
    ->ArgNames({"branches", "depth", "width", "batch", "multistream"})
    ->Args({4, 8, 256, 64, 1})
    ->Args({1, 32, 256, 64, 0})
    ->Args({4, 4, 1024, 256, 1})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GraphBackward)
    ->Name("GraphBackward")
    ->ArgNames({"branches", "depth", "width", "batch", "multistream"})
    ->Args({4, 8, 256, 64, 0})
    ->Args({4, 8, 256, 64, 1})
    ->Args({1, 32, 256, 64, 0})
    ->Args({4, 4, 1024, 256, 0})
    ->Args({4, 4, 1024, 256, 1})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// The hand-written graph: graphward's backward kernels for the single-stream study, launched by
// hand on preallocated buffers inside one stream capture.
void BM_HandWrittenGraph(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int k = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const std::int64_t n = state.range(2), batch = state.range(3);
  Model m(k, d, n, batch, false);
  gw::Stream stream(kDev);
  const cudaStream_t s = stream.get();
  std::vector<std::vector<gw::Tensor>> in(k), out(k);
  gw::Tensor total;
  {
    gw::NoGradGuard no_grad;
    gw::StreamGuard g(stream);
    for (int i = 0; i < k; ++i) {
      gw::Tensor h = m.x;
      for (int j = 0; j < d; ++j) {
        in[i].push_back(h);
        h = gw::relu(gw::linear(h, m.w[i][j], m.b[i][j]));
        out[i].push_back(h);
      }
      total = total.defined() ? gw::add(total, h) : h;
    }
  }
  gw::Tensor one, dtotal;
  std::vector<gw::Tensor> dz, dh, dw, db;
  {
    gw::StreamGuard g(stream);
    one = gw::ones({1}, kF32);
    dtotal = gw::Tensor::empty({batch, n}, kF32);
    for (int i = 0; i < k; ++i) {
      dz.push_back(gw::Tensor::empty({batch, n}, kF32));
      dh.push_back(gw::Tensor::empty({batch, n}, kF32));
    }
    for (int i = 0; i < k * d; ++i) {
      dw.push_back(gw::Tensor::empty({n, n}, kF32));
      db.push_back(gw::Tensor::empty({n}, kF32));
    }
  }
  namespace kk = graphward::kernels;
  auto backward = [&] {
    kk::mse_loss_backward(dtotal.data<float>(), nullptr, one.data<float>(), total.data<float>(),
                          m.target.data<float>(), batch * n, false, false, s);
    for (int i = k - 1; i >= 0; --i) {
      const float* grad = dtotal.data<float>();
      for (int j = d - 1; j >= 0; --j) {
        kk::relu_backward(dz[i].data<float>(), grad, out[i][j].data<float>(), batch * n, false, s);
        float* dwp = dw[i * d + j].data<float>();
        float* dbp = db[i * d + j].data<float>();
        if (!gw::gemm_bias_grad(kDev, s, true, false, n, n, batch, 1.f, dz[i].data<float>(),
                                in[i][j].data<float>(), 0.f, dwp, dbp)) {
          gw::gemm(kDev, s, true, false, n, n, batch, 1.f, dz[i].data<float>(),
                   in[i][j].data<float>(), 0.f, dwp);
          kk::column_sum(dbp, dz[i].data<float>(), nullptr, 1.f, batch, n, false, s);
        }
        if (j > 0) {
          gw::gemm(kDev, s, false, false, batch, n, n, 1.f, dz[i].data<float>(),
                   m.w[i][j].data<float>(), 0.f, dh[i].data<float>());
          grad = dh[i].data<float>();
        }
      }
    }
  };
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
  double host = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    GW_CUDA_CHECK(cudaGraphLaunch(exec, s));
    const auto t1 = std::chrono::steady_clock::now();
    stream.synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    host += std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  state.counters["host_us"] = 1e6 * host / static_cast<double>(state.iterations());
  std::size_t nodes = 0;
  GW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  state.counters["graph_nodes"] = static_cast<double>(nodes);
  GW_CUDA_CHECK(cudaGraphExecDestroy(exec));
  GW_CUDA_CHECK(cudaGraphDestroy(graph));
}
BENCHMARK(BM_HandWrittenGraph)
    ->Name("HandWrittenGraph")
    ->ArgNames({"branches", "depth", "width", "batch"})
    ->Args({4, 8, 256, 64})
    ->Args({1, 32, 256, 64})
    ->Args({4, 4, 1024, 256})
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
    gw::capture::tape_signature(sig, roots, seeds, gw::current_stream(kDev),
                                gw::GradWrite::kOverwrite);
    benchmark::DoNotOptimize(sig.same_structure(first) && sig.same_addresses(first));
  }
  state.counters["nodes"] = first.num_nodes();
  state.counters["words"] = static_cast<double>(first.structure.size());
}
BENCHMARK(BM_Signature)->Name("Signature")->ArgName("depth")->Arg(8)->Arg(24)->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
