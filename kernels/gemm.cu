#include <climits>

#include "engine/error.h"
#include "kernels/gemm.h"

namespace graphward::kernels {

void gemm(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c,
          cudaStream_t stream) {
  GW_CHECK(m > 0 && n > 0 && k > 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
           "gemm: sizes m=", m, " n=", n, " k=", k, " must be in [1, INT_MAX]");
  if (blas.bound_stream != stream || stream == nullptr) {
    GW_CUBLAS_CHECK(cublasSetStream(blas.handle, stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(blas.handle, blas.workspace, blas.workspace_bytes));
  }
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  GW_CUBLAS_CHECK(cublasSgemm(blas.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a, lda,
                              &beta, c, static_cast<int>(n)));
}

}  // namespace graphward::kernels
