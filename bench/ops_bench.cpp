// Per-op costs of the eager CUDA ops (Google Benchmark).
//
// HostCost/*: host time to issue one op (checks, stream-ordered allocation, launch), the number
// that bounds an eager backward when kernels are small. The stream is synchronized every 256
// iterations so the queue never fills; the wall time per iteration is the host cost. GpuTime/*: GPU
// time of a linear layer's forward + backward, timed with CUDA events around 20 repetitions (manual
// time), after a warm-up.
//
//   graphward_bench_ops --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <map>

#include "engine/blas.h"
#include "engine/graphward.h"
#include "kernels/gemm.h"

namespace gw = graphward;

namespace {

bool skip_without_gpu(benchmark::State& state) {
  if (gw::cuda_available()) return false;
  state.SkipWithError(("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
  return true;
}

const gw::TensorOptions kGpu{gw::DType::kFloat32, gw::Device::cuda(0)};

template <class F>
void host_cost(benchmark::State& state, F&& op) {
  if (skip_without_gpu(state)) return;
  const cudaStream_t s = gw::current_stream(gw::Device::cuda(0));
  for (int i = 0; i < 16; ++i) op();  // warm-up: pool, handles, workspace
  GW_CUDA_CHECK(cudaStreamSynchronize(s));
  std::int64_t n = 0;
  for (auto _ : state) {
    op();
    if (++n % 256 == 0) {
      state.PauseTiming();
      GW_CUDA_CHECK(cudaStreamSynchronize(s));
      state.ResumeTiming();
    }
  }
  GW_CUDA_CHECK(cudaStreamSynchronize(s));
  state.counters["host_us_per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 1e-6,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_HostCost_Relu(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const gw::Tensor x = gw::randn({64, 256}, 1, kGpu);
  host_cost(state, [&] { benchmark::DoNotOptimize(gw::relu(x)); });
}
BENCHMARK(BM_HostCost_Relu)->Name("HostCost/relu_64x256")->MinTime(0.2);

void BM_HostCost_Linear(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const gw::Tensor x = gw::randn({64, 256}, 1, kGpu), w = gw::randn({256, 256}, 2, kGpu),
                   b = gw::randn({256}, 3, kGpu);
  host_cost(state, [&] { benchmark::DoNotOptimize(gw::linear(x, w, b)); });
}
BENCHMARK(BM_HostCost_Linear)->Name("HostCost/linear_64x256x256")->MinTime(0.2);

void BM_HostCost_LinearBackward(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const gw::Tensor x = gw::randn({64, 256}, 1, kGpu), w = gw::randn({256, 256}, 2, kGpu),
                   dy = gw::randn({64, 256}, 3, kGpu);
  gw::Tensor dx = gw::zeros({64, 256}, kGpu), dw = gw::zeros({256, 256}, kGpu),
             db = gw::zeros({256}, kGpu);
  host_cost(state, [&] { gw::linear_backward(dy, x, w, {&dx}, {&dw, true}, {&db, true}); });
}
BENCHMARK(BM_HostCost_LinearBackward)->Name("HostCost/linear_backward_64x256x256")->MinTime(0.2);

struct LinearInputs {
  gw::Tensor x, w, b, dy, dx, dw, db;
};

// Inputs are drawn once per size: random tensors are generated on the host (engine/random.h), which
// for 4096² takes seconds, and Google Benchmark calls a benchmark several times.
LinearInputs& linear_inputs(std::int64_t n) {
  static std::map<std::int64_t, LinearInputs> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    LinearInputs in{gw::randn({n, n}, 1, kGpu), gw::randn({n, n}, 2, kGpu), gw::randn({n}, 3, kGpu),
                    gw::randn({n, n}, 4, kGpu), gw::zeros({n, n}, kGpu),    gw::zeros({n, n}, kGpu),
                    gw::zeros({n}, kGpu)};
    it = cache.emplace(n, std::move(in)).first;
  }
  return it->second;
}

void BM_GpuTime_Linear(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::int64_t n = state.range(0);
  LinearInputs& in = linear_inputs(n);
  const gw::Tensor &x = in.x, &w = in.w, &b = in.b, &dy = in.dy;
  gw::Tensor &dx = in.dx, &dw = in.dw, &db = in.db;
  const cudaStream_t s = gw::current_stream(gw::Device::cuda(0));
  auto step = [&] {
    benchmark::DoNotOptimize(gw::linear(x, w, b));
    gw::linear_backward(dy, x, w, {&dx}, {&dw}, {&db});
  };
  for (int i = 0; i < 5; ++i) step();
  gw::Event start(gw::Device::cuda(0), true), stop(gw::Device::cuda(0), true);
  constexpr int kReps = 20;
  for (auto _ : state) {
    start.record(s);
    for (int i = 0; i < kReps; ++i) step();
    stop.record(s);
    stop.synchronize();
    state.SetIterationTime(stop.elapsed_ms_since(start) * 1e-3 / kReps);
  }
  const double flops = 3.0 * 2.0 * double(n) * n * n;  // forward + two backward GEMMs
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GpuTime_Linear)
    ->Name("GpuTime/linear_fwd_bwd")
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096)
    ->UseManualTime()
    ->MinTime(0.2)
    ->Unit(benchmark::kMicrosecond);

// ---- the cost of single CUDA API calls on this machine: the floor under every eager op ----------

__global__ void empty_kernel() {}

void BM_ApiCost(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int which = static_cast<int>(state.range(0));
  gw::Stream s(gw::Device::cuda(0)), other(gw::Device::cuda(0));
  gw::Event e(gw::Device::cuda(0));
  const gw::Tensor a = gw::randn({64, 256}, 1, kGpu), w = gw::randn({256, 256}, 2, kGpu);
  gw::Tensor c = gw::zeros({64, 256}, kGpu);
  const graphward::kernels::BlasContext blas = gw::blas_context(gw::Device::cuda(0), s.get());
  std::int64_t n = 0;
  for (auto _ : state) {
    switch (which) {
      case 0:
        empty_kernel<<<1, 32, 0, s.get()>>>();
        break;
      case 1: {
        void* p = nullptr;
        GW_CUDA_CHECK(cudaMallocAsync(&p, 64 * 256 * 4, s.get()));
        GW_CUDA_CHECK(cudaFreeAsync(p, s.get()));
        break;
      }
      case 2:
        e.record(s.get());
        e.block(other.get());
        break;
      case 3:
        graphward::kernels::gemm(blas, false, true, 64, 256, 256, 1.f, a.data<float>(),
                                 w.data<float>(), 0.f, c.data<float>(), s.get());
        break;
      case 4: {
        int d = 0;
        GW_CUDA_CHECK(cudaGetDevice(&d));
        break;
      }
      case 5:
        gw::gemm(gw::Device::cuda(0), s.get(), false, true, 64, 256, 256, 1.f, a.data<float>(),
                 w.data<float>(), 0.f, c.data<float>());
        break;
    }
    if (++n % 256 == 0) {
      state.PauseTiming();
      s.synchronize();
      other.synchronize();
      state.ResumeTiming();
    }
  }
  s.synchronize();
  state.SetLabel(which == 0   ? "empty kernel launch"
                 : which == 1 ? "cudaMallocAsync + cudaFreeAsync"
                 : which == 2 ? "cudaEventRecord + cudaStreamWaitEvent"
                 : which == 3 ? "cuBLAS SGEMM 64x256x256 (bound handle)"
                 : which == 4 ? "cudaGetDevice"
                              : "graphward::gemm 64x256x256 (cuBLASLt, cached plan)");
}
BENCHMARK(BM_ApiCost)->Name("ApiCost")->DenseRange(0, 5)->MinTime(0.2);

// The eager backward's GEMMs through a cuBLASLt plan, with and without split-K algorithms, and the
// weight-gradient GEMM with its bias gradient fused: host time per call (queue never full), GPU
// time per call (events around 50 calls), and kernels per call (one call captured into a graph and
// its kernel nodes counted). The label is the algorithm the heuristic chose.
// Args: width N, batch B, which (0: dX [B,N] = dY[B,N]·W[N,N]; 1: dW [N,N] = dYᵀ·X[B,N];
// 2: dW with db = Σ_rows dY fused), split_k (1: the heuristic's first choice; 0: one kernel).
void BM_LtGemm(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::int64_t width = state.range(0), batch = state.range(1);
  const int which = static_cast<int>(state.range(2));
  const bool split_k = state.range(3) != 0;
  const bool bias_grad = which == 2;
  const bool ta = which != 0, tb = false;
  const std::int64_t m = which == 0 ? batch : width, n = width, k = which == 0 ? width : batch;
  const gw::Device dev = gw::Device::cuda(0);
  gw::Stream s(dev);
  const gw::Tensor a = gw::randn({ta ? k : m, ta ? m : k}, 1, kGpu),
                   b = gw::randn({tb ? n : k, tb ? k : n}, 2, kGpu);
  gw::Tensor c = gw::zeros({m, n}, kGpu), bias = gw::zeros({m}, kGpu);
  cublasLtHandle_t handle = nullptr;
  GW_CUBLAS_CHECK(cublasLtCreate(&handle));
  gw::DeviceBuffer workspace(dev, gw::kBlasWorkspaceBytes);
  {
    graphward::kernels::LtGemm plan(handle, ta, tb, m, n, k, workspace.bytes(), 256,
                                    {.bias_grad_a = bias_grad, .split_k = split_k});
    if (!plan.usable()) {
      state.SkipWithError("cuBLASLt offers no algorithm for this configuration");
    } else {
      auto run = [&] {
        plan.run(1.f, a.data<float>(), b.data<float>(), 0.f, c.data<float>(), workspace.data(),
                 workspace.bytes(), s.get(), bias.data<float>());
      };
      GW_CUDA_CHECK(cudaDeviceSynchronize());  // the inputs were made on another stream
      for (int i = 0; i < 20; ++i) run();
      s.synchronize();
      // kernels per call (-1: the call could not be captured)
      double nodes = -1;
      cudaGraph_t graph = nullptr;
      if (cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        try {
          run();
        } catch (const gw::Error&) {
        }
        if (cudaStreamEndCapture(s.get(), &graph) == cudaSuccess && graph) {
          std::size_t count = 0;
          if (cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess) nodes = double(count);
          GW_CUDA_CHECK(cudaGraphDestroy(graph));
        }
      }
      (void)cudaGetLastError();
      // GPU time per call
      gw::Event start(dev, true), stop(dev, true);
      start.record(s.get());
      for (int i = 0; i < 50; ++i) run();
      stop.record(s.get());
      stop.synchronize();
      const double gpu_us = stop.elapsed_ms_since(start) * 1e3 / 50;
      std::int64_t calls = 0;
      for (auto _ : state) {
        run();
        if (++calls % 32 == 0) {
          state.PauseTiming();
          s.synchronize();
          state.ResumeTiming();
        }
      }
      s.synchronize();
      state.counters["graph_nodes"] = nodes;
      state.counters["gpu_us"] = gpu_us;
      state.SetLabel(plan.describe());
    }
  }
  workspace = gw::DeviceBuffer();
  GW_CUBLAS_CHECK(cublasLtDestroy(handle));
}
BENCHMARK(BM_LtGemm)
    ->Name("LtGemm")
    ->ArgNames({"width", "batch", "which", "split_k"})
    ->ArgsProduct({{256}, {64}, {0, 1, 2}, {1, 0}})
    ->ArgsProduct({{1024}, {256}, {0, 1, 2}, {1, 0}})
    ->MinTime(0.2)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
