// Every cuBLASLt configuration of one fp32 GEMM, timed: what the heuristic offers and what it
// could offer (Note [Choosing a GEMM algorithm], engine/runtime/blas.cpp, times the heuristic's
// candidates only). Row-major C[m,n] = op(A)·op(B) (+ a bias of n, or a bias gradient of m), the
// layout of kernels/gemm.h, no TF32.
//
//   graphward_lt_sweep M N K TRANS_A TRANS_B EPILOGUE     EPILOGUE 0: none, 1: bias, 2: bias
//   gradient, 3: bias and GELU with its input kept (GELU_AUX_BIAS), 4: GELU's derivative (DGELU)
//
// The operands hold values in [-1, 1) (zeros draw less power, and a GEMM's clock follows its
// power). For each of the heuristic's first four candidates: the GPU time of a launch in a CUDA
// graph of 20 (median of 7 replays), back to back on a stream (60 queued behind a spinning
// kernel), and the host time of a cublasLtMatmul call. Then every algorithm, tile, stage count,
// custom option (0–3), split of k (1–32) and reduction scheme cuBLASLt accepts for the GEMM: each
// first timed by one launch between events (skipped where that is over 1.5× the fastest so far),
// the rest in a graph of 4 (median of 3 replays), and the ten fastest of those again as the
// candidates are; and cublasSgemm's GEMM (no epilogue) for comparison.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(long status, const char* what) {
  if (status != 0)
    throw std::runtime_error(std::string(what) + " failed: " + std::to_string(status));
}

// x[i] in [-1, 1), from a hash of i.
__global__ void fill(float* x, long n, unsigned salt) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = static_cast<float>(h >> 8) * (2.f / 16777216.f) - 1.f;
  }
}

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

struct Sweep {
  long m, n, k;
  bool ta, tb;
  int epilogue;
  cublasLtHandle_t lt = nullptr;
  cudaStream_t s = nullptr;
  float *a = nullptr, *b = nullptr, *c = nullptr, *bias = nullptr, *aux = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = std::size_t{32} << 20;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasOperation_t op_a{}, op_b{};
  float alpha = 1, beta = 0;

  void setup() {
    check(cublasLtCreate(&lt), "cublasLtCreate");
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    for (auto [p, count] :
         {std::pair{&a, m * k}, {&b, n * k}, {&c, m * n}, {&bias, std::max(m, n)}, {&aux, m * n}}) {
      check(cudaMalloc(p, count * sizeof(float)), "cudaMalloc");
      fill<<<1024, 256>>>(*p, count, static_cast<unsigned>(count));
      check(cudaGetLastError(), "fill");
    }
    check(cudaDeviceSynchronize(), "fill");
    check(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
    // cuBLASLt's column-major view of the row-major product: C^T[n,m] = op(B)^T · op(A)^T, its A
    // our B and its B our A.
    op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
          "transa");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
          "transb");
    if (epilogue != 0) {
      constexpr cublasLtEpilogue_t kEpilogues[] = {
          CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BGRADB,
          CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};
      const cublasLtEpilogue_t e = kEpilogues[epilogue];
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)),
            "epilogue");
      if (epilogue != 4) {
        check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof(bias)),
              "bias");
      }
      if (epilogue >= 3) {
        // The GELU input, laid out like C (column-major [n, m]).
        const std::int64_t ld = n;
        check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                             sizeof(aux)),
              "aux");
        check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                             sizeof(ld)),
              "aux ld");
      }
    }
    const bool na = op_a == CUBLAS_OP_N, nb = op_b == CUBLAS_OP_N;
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, na ? n : k, na ? k : n, na ? n : k),
          "layout a");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, nb ? k : m, nb ? m : k, nb ? k : m),
          "layout b");
    check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n), "layout c");
  }
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &algo, ws, ws_bytes,
                          s);
  }
  // µs a launch in a graph of `launches` (median of 7 replays, or 3 where `quick`); negative where
  // the launch fails.
  double graph_us(const std::function<cublasStatus_t()>& launch, int launches = 20,
                  bool quick = false) {
    for (int i = 0; i < (quick ? 1 : 3); ++i) {
      if (launch() != CUBLAS_STATUS_SUCCESS) return -1;
    }
    check(cudaStreamSynchronize(s), "sync");
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    for (int i = 0; i < launches; ++i) launch();
    check(cudaStreamEndCapture(s, &g), "end capture");
    check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    const double us = median_us(
        launches, [&] { check(cudaGraphLaunch(ge, s), "graph launch"); }, false, quick ? 3 : 7);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return us;
  }
  // µs a launch of `count` issued by `issue` (median of `reps`), the launches queued behind a
  // spinning kernel where `hold` (so the host's issue rate is not timed).
  double median_us(int count, const std::function<void()>& issue, bool hold, int reps = 7) {
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      if (hold) spin<<<1, 1, 0, s>>>(4000000);
      check(cudaEventRecord(e0, s), "record");
      issue();
      check(cudaEventRecord(e1, s), "record");
      check(cudaEventSynchronize(e1), "event sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      t.push_back(ms * 1000 / count);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  double host_us(const cublasLtMatmulAlgo_t& algo) {
    std::vector<double> t;
    for (int r = 0; r < 31; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 32; ++i) run(algo);
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          32);
      check(cudaStreamSynchronize(s), "sync");
    }
    std::sort(t.begin(), t.end());
    return t[15];
  }
};

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    std::uint32_t v = 0;
    std::size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    return std::to_string(v);
  };
  return "algo " + get(CUBLASLT_ALGO_CONFIG_ID) + " tile " + get(CUBLASLT_ALGO_CONFIG_TILE_ID) +
         " stages " + get(CUBLASLT_ALGO_CONFIG_STAGES_ID) + " splitK " +
         get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) + " reduction " +
         get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) + " option " +
         get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
}

// Every configuration cuBLASLt accepts for the GEMM (up to 3000): each one launch timed alone
// (dropped where over 1.5× the fastest so far, or where it fails), then in a graph of 4; the ten
// fastest again in a graph of 20.
std::vector<std::pair<double, std::string>> exhaustive(Sweep& w) {
  int ids[200];
  int n_ids = 0;
  check(cublasLtMatmulAlgoGetIds(w.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                 CUDA_R_32F, CUDA_R_32F, 200, ids, &n_ids),
        "cublasLtMatmulAlgoGetIds");
  struct Timed {
    double us;
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<Timed> screened;
  double fastest = 1e30;
  int tried = 0;
  for (int i = 0; i < n_ids && tried < 3000; ++i) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(w.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                               CUDA_R_32F, CUDA_R_32F, ids[i], &algo) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    std::size_t bytes = 0;
    std::uint32_t tiles[128], stages[128];
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof(tiles),
                                      &bytes);
    const int n_tiles = std::max<int>(1, static_cast<int>(bytes / 4));
    if (bytes == 0) tiles[0] = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof(stages),
                                      &bytes);
    const int n_stages = std::max<int>(1, static_cast<int>(bytes / 4));
    if (bytes == 0) stages[0] = 0;
    std::int32_t split_ok = 0, options = 0;
    std::uint32_t schemes = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_ok, 4,
                                      &bytes);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, 4,
                                      &bytes);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &options, 4,
                                      &bytes);
    for (int t = 0; t < n_tiles; ++t) {
      for (int st = 0; st < n_stages; ++st) {
        for (std::int32_t option = 0; option <= std::min(options, 3); ++option) {
          for (std::int32_t split : {1, 2, 4, 8, 16, 32}) {
            for (std::uint32_t scheme : {0u, 1u, 2u, 4u}) {
              if ((split == 1) != (scheme == 0)) continue;
              if (split > 1 && (!split_ok || !(schemes & scheme))) continue;
              cublasLtMatmulAlgo_t one = algo;
              cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t],
                                                   4);
              cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                   &stages[st], 4);
              cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                   &option, 4);
              cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                   4);
              cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                   &scheme, 4);
              cublasLtMatmulHeuristicResult_t result{};
              if (cublasLtMatmulAlgoCheck(w.lt, w.desc, w.la, w.lb, w.lc, w.lc, &one, &result) !=
                      CUBLAS_STATUS_SUCCESS ||
                  result.workspaceSize > w.ws_bytes || ++tried > 3000) {
                continue;
              }
              if (w.run(one) != CUBLAS_STATUS_SUCCESS) continue;
              const double once = w.median_us(
                  1, [&] { w.run(one); }, false, 1);
              if (once > 1.5 * fastest) continue;
              const double us = w.graph_us([&] { return w.run(one); }, 4, true);
              if (us <= 0) continue;
              fastest = std::min(fastest, us);
              screened.push_back({us, one});
            }
          }
        }
      }
    }
  }
  std::sort(screened.begin(), screened.end(),
            [](const Timed& x, const Timed& y) { return x.us < y.us; });
  std::vector<std::pair<double, std::string>> out;
  for (std::size_t i = 0; i < std::min<std::size_t>(screened.size(), 10); ++i) {
    out.emplace_back(w.graph_us([&] { return w.run(screened[i].algo); }),
                     describe(screened[i].algo));
  }
  std::sort(out.begin(), out.end());
  std::printf("  every configuration: %d algorithms, %d configurations tried, %zu timed\n", n_ids,
              tried, screened.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s M N K TRANS_A TRANS_B EPILOGUE (0 none, 1 bias, 2 bias gradient, 3 "
                 "bias+GELU keeping its input, 4 GELU's derivative)\n",
                 argv[0]);
    return 2;
  }
  Sweep w{std::atol(argv[1]),      std::atol(argv[2]),      std::atol(argv[3]),
          std::atoi(argv[4]) != 0, std::atoi(argv[5]) != 0, std::atoi(argv[6])};
  if (w.m <= 0 || w.n <= 0 || w.k <= 0 || w.epilogue < 0 || w.epilogue > 4) {
    std::fprintf(stderr, "lt_sweep: M, N, K must be positive and EPILOGUE 0 to 4\n");
    return 2;
  }
  try {
    w.setup();
    std::printf("m %ld n %ld k %ld trans_a %d trans_b %d epilogue %d\n", w.m, w.n, w.k, w.ta, w.tb,
                w.epilogue);
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const std::uint64_t ws = w.ws_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof(ws)),
          "workspace");
    cublasLtMatmulHeuristicResult_t results[8]{};
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(w.lt, w.desc, w.la, w.lb, w.lc, w.lc, pref, 8, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    std::printf("  the heuristic: %d candidates\n", found);
    for (int i = 0; i < std::min(found, 4); ++i) {
      const cublasLtMatmulAlgo_t& algo = results[i].algo;
      const double graph = w.graph_us([&] { return w.run(algo); });
      const double stream = w.median_us(
          60,
          [&] {
            for (int j = 0; j < 60; ++j) w.run(algo);
          },
          true);
      std::printf("  candidate %d: graph %.2f us, stream %.2f us, host %.2f us; %s\n", i, graph,
                  stream, w.host_us(algo), describe(algo).c_str());
    }
    const auto all = exhaustive(w);
    for (std::size_t i = 0; i < std::min<std::size_t>(all.size(), 10); ++i) {
      std::printf("  fastest %zu: graph %.2f us; %s\n", i, all[i].first, all[i].second.c_str());
    }
    cublasHandle_t blas = nullptr;
    check(cublasCreate(&blas), "cublasCreate");
    check(cublasSetStream(blas, w.s), "cublasSetStream");
    const bool na = w.op_a == CUBLAS_OP_N, nb = w.op_b == CUBLAS_OP_N;
    const double sgemm = w.graph_us([&] {
      return cublasSgemm(blas, w.op_a, w.op_b, static_cast<int>(w.n), static_cast<int>(w.m),
                         static_cast<int>(w.k), &w.alpha, w.b, static_cast<int>(na ? w.n : w.k),
                         w.a, static_cast<int>(nb ? w.k : w.m), &w.beta, w.c,
                         static_cast<int>(w.n));
    });
    std::printf("  cublasSgemm (no epilogue): graph %.2f us\n", sgemm);
    cublasDestroy(blas);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lt_sweep: %s\n", e.what());
    return 1;
  }
  return 0;
}
