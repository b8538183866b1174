#pragma once
// GEMM: C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C, all row-major.
// CUDA: cuBLAS SGEMM, fp32 with TF32 off. CPU reference: naive, accumulating in double.
// beta = 0 writes C (C may hold garbage, even NaN), beta = 1 accumulates into it.
//
// op(A) is A stored [m,k] (trans_a = false) or Aᵀ with A stored [k,m] (trans_a = true); same for B.
#include <cstddef>
#include <cstdint>

#if GRAPHWARD_HAS_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// A cuBLAS handle and the workspace it must use on one stream. The launcher calls
// cublasSetStream and then cublasSetWorkspace: setting the stream resets the workspace to cuBLAS's
// own pool, which would allocate inside a stream capture (DESIGN.md, "A trap").
// A handle that is already bound to a stream with its workspace (bound_stream) skips both calls
// on that stream: they cost host time on every GEMM.
struct BlasContext {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t bound_stream = nullptr;  // the stream the handle is bound to, if any
};

void gemm(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c,
          cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, const T* b, T beta, T* c);
}  // namespace cpu

}  // namespace graphward::kernels
