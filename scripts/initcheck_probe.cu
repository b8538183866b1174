// Whether compute-sanitizer's initcheck sees the stores of cuBLASLt's GEMM kernels (built and run
// under the tool by scripts/initcheck_probe.sh). For each shape, layout and epilogue below, each of
// the heuristic's first candidates writes a fresh, never-written output C — as a node of a captured
// CUDA graph before the algorithm ever ran, eagerly, then captured again — and a kernel of this
// program then reads every element of C. Where the
// tool saw the GEMM's stores it reports nothing; where it did not, it reports the reading kernel's
// loads. Before each trial the program prints a line
//   PROBE <trial> <mode> m <m> n <n> k <k> <layout> bf16 <epilogue> algo <id> tile <t> stages <s>
//   splitK <k>
// so that a report belongs to the trial whose line precedes it. With --mark each GEMM is followed by
// the NVTX mark graphward's GEMMs make (Note [GEMM outputs and initcheck], kernels/gemm.cu): C
// marked written on the GEMM's stream — inside the capture in the graphed modes — and the lines
// say "marked". A diagnostic, not part of the library: every figure it prints is the tool's
// behaviour, not graphward's.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "graphward/kernels/nvtx_mark.h"  // the library's mark (built with -I at the repository's root)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK_CUDA(x)                                                                 \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,                 \
                   cudaGetErrorString(e_));                                           \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)
#define CHECK_LT(x)                                                                   \
  do {                                                                                \
    cublasStatus_t s_ = (x);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x,   \
                   static_cast<int>(s_));                                             \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)

// Reads every element of c (a load the tool checks) and adds them up, so the loads stay.
template <class T>
__global__ void read_all(const T* c, long long n, float* sum) {
  float s = 0.f;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    s += static_cast<float>(c[i]);
  }
  atomicAdd(sum, s);
}

struct Shape {
  int m, n, k;
};

int attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  int v = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof(v), &written);
  return v;
}

int main(int argc, char** argv) {
  const bool mark = argc > 1 && std::strcmp(argv[1], "--mark") == 0;
  const nvtxDomainHandle_t domain = nvtxDomainCreateA("initcheck_probe");
  // The GEMMs of the bfloat16 examples and tests: a small model's (32 tokens), the transformer
  // bench's b32 s128 d256 (4096 tokens, widths 256, 768 and 1024) and a weight gradient.
  const Shape shapes[] = {{48, 32, 96}, {256, 4096, 256}, {768, 4096, 256},
                          {1024, 4096, 256}, {256, 4096, 1024}, {256, 256, 4096}};
  const int kCandidates = 2;
  cublasLtHandle_t lt = nullptr;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t workspace_bytes = 32u << 20;
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUDA(cudaMemset(workspace, 0, workspace_bytes));
  float* sum = nullptr;
  CHECK_CUDA(cudaMalloc(&sum, sizeof(float)));
  CHECK_CUDA(cudaMemset(sum, 0, sizeof(float)));
  int trial = 0;
  for (const Shape& s : shapes) {
    for (const bool trans_a : {false, true}) {
      for (const bool bias : {false, true}) {
        // Operands written (zeros and a bias of zeros): only C is ever unwritten.
        const size_t a_n = static_cast<size_t>(s.m) * s.k, b_n = static_cast<size_t>(s.k) * s.n,
                     c_n = static_cast<size_t>(s.m) * s.n;
        __nv_bfloat16 *a = nullptr, *b = nullptr, *bias_v = nullptr;
        CHECK_CUDA(cudaMalloc(&a, a_n * 2));
        CHECK_CUDA(cudaMalloc(&b, b_n * 2));
        CHECK_CUDA(cudaMalloc(&bias_v, static_cast<size_t>(s.m) * 2));
        CHECK_CUDA(cudaMemset(a, 0, a_n * 2));
        CHECK_CUDA(cudaMemset(b, 0, b_n * 2));
        CHECK_CUDA(cudaMemset(bias_v, 0, static_cast<size_t>(s.m) * 2));
        cublasLtMatmulDesc_t op = nullptr;
        CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        if (bias) {
          const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
          CHECK_LT(
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
          const cudaDataType_t bt = CUDA_R_16BF;
          CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                  sizeof(bt)));
          CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_v,
                                                  sizeof(bias_v)));
        }
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_a ? s.k : s.m,
                                            trans_a ? s.m : s.k, trans_a ? s.k : s.m));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.n, s.k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.m, s.n, s.m));
        cublasLtMatmulPreference_t pref = nullptr;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
            sizeof(workspace_bytes)));
        std::vector<cublasLtMatmulHeuristicResult_t> found(kCandidates);
        int n_found = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, kCandidates,
                                                found.data(), &n_found));
        for (int i = 0; i < n_found; ++i) {
          const cublasLtMatmulAlgo_t& algo = found[static_cast<size_t>(i)].algo;
          // Captured before the algorithm's first eager run, eagerly, then captured again.
          for (const char* mode : {"graph-first", "eager", "graph"}) {
            const bool graphed = mode[0] == 'g';
            __nv_bfloat16* c = nullptr;  // never written before the GEMM
            CHECK_CUDA(cudaMalloc(&c, c_n * 2));
            std::printf("PROBE %d %s%s m %d n %d k %d %s bf16 %s algo %d tile %d stages %d "
                        "splitK %d\n",
                        trial++, mode, mark ? "+marked" : "", s.m, s.n, s.k,
                        trans_a ? "TN" : "NN", bias ? "bias" : "none",
                        attr(algo, CUBLASLT_ALGO_CONFIG_ID), attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                        attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                        attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
            std::fflush(stdout);
            const float one = 1.f, zero = 0.f;
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            if (graphed) {
              CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
            }
            CHECK_LT(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, c, lc, c, lc, &algo,
                                    workspace, workspace_bytes, stream));
            if (mark) graphward::kernels::nvtx_mark_initialized(domain, c, c_n * 2, stream);
            read_all<<<64, 256, 0, stream>>>(c, static_cast<long long>(c_n), sum);
            CHECK_CUDA(cudaGetLastError());
            if (graphed) {
              CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
              CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
              CHECK_CUDA(cudaGraphLaunch(exec, stream));
            }
            CHECK_CUDA(cudaStreamSynchronize(stream));
            if (exec) CHECK_CUDA(cudaGraphExecDestroy(exec));
            if (graph) CHECK_CUDA(cudaGraphDestroy(graph));
            CHECK_CUDA(cudaFree(c));
          }
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaFree(b));
        CHECK_CUDA(cudaFree(bias_v));
      }
    }
  }
  std::printf("PROBE END %d trials\n", trial);
  CHECK_CUDA(cudaFree(sum));
  CHECK_CUDA(cudaFree(workspace));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_LT(cublasLtDestroy(lt));
  return 0;
}
