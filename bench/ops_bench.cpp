// Per-op costs of the eager CUDA ops (Google Benchmark).
//
// HostCost/*: host time to issue one op (checks, stream-ordered allocation, launch), the number
// that bounds an eager backward when kernels are small. The stream is synchronized every 256
// iterations so the queue never fills; the wall time per iteration is the host cost. GpuTime/*: GPU
// time of a linear layer's forward + backward, timed with CUDA events around 20 repetitions (manual
// time), after a warm-up. Record/*, RecordCpu/*, Launch/*: what recording the eager forward costs
// per op (below).
//
//   graphward_bench_ops --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <functional>
#include <map>
#include <optional>

#include "graphward/capture/backward_graph.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/graphward.h"
#include "graphward/kernels/gemm.h"

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

// Inputs are drawn once per size: random tensors are generated on the host (engine/runtime/random.h),
// which for 4096² takes seconds, and Google Benchmark calls a benchmark several times.
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

// ---- what recording costs: the eager forward a training loop runs ------------------------------
// Record/<op>/mode:M — host time to issue one op, its output dropped at once (so a recorded node
// and its saved tensors are freed every iteration, as a step's tape is):
//   mode 0 — nothing requires grad (nothing recorded: checks, allocation, launch);
//   mode 1 — an input requires grad (the node, its inputs' metadata, its saved tensors);
//   mode 2 — mode 1 as a replayed training loop records: a BackwardGraph alive on the thread (its
//            tape log appends and compares every node, Note [Tape log]), in a StepScope (the
//            step arena serves the allocations; a new step every 64 ops).
// Launch/linear_*: the same layer's kernel alone (gemm_epilogue: cuBLASLt with the bias fused,
// through graphward's cached plan), into a preallocated output — the floor the recorded layer is
// compared with.
using MakeInputs = std::function<std::vector<gw::Tensor>(bool grad)>;
using OpFn = std::function<gw::Tensor(const std::vector<gw::Tensor>&)>;

void record_cost(benchmark::State& state, const MakeInputs& make, const OpFn& op,
                 gw::Device dev = gw::Device::cuda(0)) {
  if (dev.is_cuda() && skip_without_gpu(state)) return;
  const int mode = static_cast<int>(state.range(0));
  const std::vector<gw::Tensor> in = make(mode > 0);
  std::optional<gw::BackwardGraph> bw;
  std::optional<gw::StepArena> arena;
  std::optional<gw::StepScope> scope;
  if (mode == 2) {
    bw.emplace(dev);
    arena.emplace(dev);
    scope.emplace(*arena);
  }
  const cudaStream_t s = dev.is_cuda() ? gw::current_stream(dev) : nullptr;
  for (int i = 0; i < 64; ++i) benchmark::DoNotOptimize(op(in));  // warm-up
  std::int64_t n = 0;
  auto new_step = [&] {
    if (!scope) return;
    scope.reset();
    if (dev.is_cuda()) arena->record_step_end(s);
    scope.emplace(*arena);
  };
  new_step();
  for (auto _ : state) {
    benchmark::DoNotOptimize(op(in));
    if (++n % 64 == 0) {
      state.PauseTiming();
      new_step();
      if (n % 256 == 0 && dev.is_cuda()) GW_CUDA_CHECK(cudaStreamSynchronize(s));
      state.ResumeTiming();
    }
  }
  scope.reset();
  if (dev.is_cuda()) GW_CUDA_CHECK(cudaStreamSynchronize(s));
  state.counters["host_us_per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 1e-6,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(mode == 0 ? "no grad" : mode == 1 ? "recorded" : "recorded, tape log, step arena");
}

gw::Tensor param(const gw::Shape& shape, std::uint64_t seed, bool grad) {
  gw::Tensor t = gw::mul(gw::randn(shape, seed, kGpu), 0.1).detach();
  if (grad) t.set_requires_grad(true);
  return t;
}

void record_rows(benchmark::internal::Benchmark* b) {
  b->ArgName("mode")->DenseRange(0, 2)->MinTime(0.2);
}

void record_bench(const std::string& name, MakeInputs make, OpFn op) {
  benchmark::RegisterBenchmark(("Record/" + name).c_str(), [make = std::move(make),
                                                            op = std::move(op)](
                                                               benchmark::State& st) {
    record_cost(st, make, op);
  })->Apply(record_rows);
}

using V = std::vector<gw::Tensor>;
// RecordCpu/<op>/mode:M — the same on the CPU backend with tensors of a few elements: what is left
// is the host's bookkeeping of an op (checks, the output's tensor, the node and its record, the
// saved tensors), with no CUDA call at all; it runs on any machine.
const int kRecordCpuRows = [] {
  const gw::Device cpu = gw::Device::cpu();
  auto cpu_param = [](const gw::Shape& shape, std::uint64_t seed, bool grad) {
    gw::Tensor t = gw::randn(shape, seed);
    if (grad) t.set_requires_grad(true);
    return t;
  };
  auto add_row = [cpu](const std::string& name, MakeInputs make, OpFn op) {
    benchmark::RegisterBenchmark(("RecordCpu/" + name).c_str(), [make = std::move(make),
                                                                 op = std::move(op),
                                                                 cpu](benchmark::State& st) {
      record_cost(st, make, op, cpu);
    })->Apply(record_rows);
  };
  add_row(
      "linear_4x8x8",
      [=](bool g) {
        return V{gw::randn({4, 8}, 1), cpu_param({8, 8}, 2, g), cpu_param({8}, 3, g)};
      },
      [](const V& v) { return gw::linear(v[0], v[1], v[2]); });
  add_row(
      "relu_4x8",
      [=](bool g) {
        return V{cpu_param({4, 8}, 1, g)};
      },
      [](const V& v) { return gw::relu(v[0]); });
  add_row(
      "add_4x8",
      [=](bool g) {
        return V{cpu_param({4, 8}, 1, g), cpu_param({4, 8}, 2, g)};
      },
      [](const V& v) { return gw::add(v[0], v[1]); });
  return 0;
}();
// The examples' ops at the transformer's and the MLP's sizes.
const int kRecordRows = [] {
  record_bench(
      "linear_128x256x256",
      [](bool g) {
        return V{gw::randn({128, 256}, 1, kGpu), param({256, 256}, 2, g), param({256}, 3, g)};
      },
      [](const V& v) { return gw::linear(v[0], v[1], v[2]); });
  record_bench(
      "linear_gelu_128x256x256",
      [](bool g) {
        return V{gw::randn({128, 256}, 1, kGpu), param({256, 256}, 2, g), param({256}, 3, g)};
      },
      [](const V& v) { return gw::linear(v[0], v[1], v[2], gw::Activation::kGelu); });
  record_bench(
      "relu_128x256",
      [](bool g) {
        return V{param({128, 256}, 1, g)};
      },
      [](const V& v) { return gw::relu(v[0]); });
  record_bench(
      "gelu_128x256",
      [](bool g) {
        return V{param({128, 256}, 1, g)};
      },
      [](const V& v) { return gw::gelu(v[0]); });
  record_bench(
      "add_512x64",
      [](bool g) {
        return V{param({512, 64}, 1, g), param({512, 64}, 2, g)};
      },
      [](const V& v) { return gw::add(v[0], v[1]); });
  record_bench(
      "mul_scalar_64x32x32",
      [](bool g) {
        return V{param({64, 32, 32}, 1, g)};
      },
      [](const V& v) { return gw::mul(v[0], 0.25); });
  record_bench(
      "layer_norm_512x64",
      [](bool g) {
        return V{param({512, 64}, 1, g), param({64}, 2, g), param({64}, 3, g)};
      },
      [](const V& v) { return gw::layer_norm(v[0], v[1], v[2]); });
  record_bench(
      "softmax_64x32x32",
      [](bool g) {
        return V{param({64, 32, 32}, 1, g)};
      },
      [](const V& v) { return gw::softmax(v[0]); });
  record_bench(
      "bmm_64x32x16",
      [](bool g) {
        return V{param({64, 32, 16}, 1, g), param({64, 32, 16}, 2, g)};
      },
      [](const V& v) { return gw::bmm(v[0], v[1], false, true); });
  record_bench(
      "reshape_512x64",
      [](bool g) {
        return V{param({512, 64}, 1, g)};
      },
      [](const V& v) {
        return gw::reshape(v[0], {16, 32, 4, 16});
      });
  record_bench(
      "transpose_16x32x4x16",
      [](bool g) {
        return V{param({16, 32, 4, 16}, 1, g)};
      },
      [](const V& v) { return gw::transpose(v[0], 1, 2); });
  record_bench(
      "narrow_512x192",
      [](bool g) {
        return V{param({512, 192}, 1, g)};
      },
      [](const V& v) { return gw::narrow(v[0], 64, 64); });
  record_bench(
      "embedding_64x64_ids512",
      [](bool g) {
        std::vector<std::int32_t> ids(512);
        for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % 64);
        return V{param({64, 64}, 1, g), gw::from_vector(ids, {16, 32}, gw::Device::cuda(0))};
      },
      [](const V& v) { return gw::embedding(v[0], v[1]); });
  record_bench(
      "cross_entropy_512x64",
      [](bool g) {
        std::vector<std::int32_t> t(512);
        for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>(i % 64);
        return V{param({512, 64}, 1, g), gw::from_vector(t, {512}, gw::Device::cuda(0))};
      },
      [](const V& v) { return gw::cross_entropy(v[0], v[1]); });
  record_bench(
      "conv2d_64x16x16x16",
      [](bool g) {
        return V{gw::randn({64, 16, 16, 16}, 1, kGpu), param({32, 16, 3, 3}, 2, g),
                 param({32}, 3, g)};
      },
      [](const V& v) {
        return gw::conv2d(v[0], v[1], v[2], {.padding = 1, .deterministic = false});
      });
  record_bench(
      "max_pool2d_64x16x16x16",
      [](bool g) {
        return V{param({64, 16, 16, 16}, 1, g)};
      },
      [](const V& v) { return gw::max_pool2d(v[0]); });
  return 0;
}();

void BM_LaunchLinear(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const bool gelu = state.range(0) != 0;
  const gw::Device dev = gw::Device::cuda(0);
  const gw::Tensor x = gw::randn({128, 256}, 1, kGpu), w = gw::randn({256, 256}, 2, kGpu),
                   b = gw::randn({256}, 3, kGpu);
  gw::Tensor y = gw::zeros({128, 256}, kGpu), z = gw::zeros({128, 256}, kGpu);
  const auto ep =
      gelu ? graphward::kernels::Epilogue::kBiasGeluAux : graphward::kernels::Epilogue::kBias;
  host_cost(state, [&] {
    const bool ok = gw::gemm_epilogue(dev, gw::current_stream(dev), false, true, 128, 256, 256,
                                      x.data<float>(), w.data<float>(), y.data<float>(), ep,
                                      b.data<float>(), gelu ? z.raw_data() : nullptr);
    if (!ok) state.SkipWithError("cuBLASLt offers no algorithm for the epilogue");
  });
  state.SetLabel(gelu ? "cuBLASLt GEMM + bias + GELU (aux)" : "cuBLASLt GEMM + bias");
}
BENCHMARK(BM_LaunchLinear)
    ->Name("Launch/linear_128x256x256")
    ->ArgName("gelu")
    ->DenseRange(0, 1)
    ->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
