#include <algorithm>
#include <vector>

#include "graphward/kernels/gemm.h"

namespace graphward::kernels::cpu {

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, const T* b, T beta, T* c) {
  std::vector<double> row(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (std::int64_t p = 0; p < k; ++p) {  // i-p-j order: the inner loop walks B's rows
      const double av = trans_a ? a[p * m + i] : a[i * k + p];
      if (trans_b) {
        for (std::int64_t j = 0; j < n; ++j) row[j] += av * double(b[j * k + p]);
      } else {
        const T* brow = b + p * n;
        for (std::int64_t j = 0; j < n; ++j) row[j] += av * double(brow[j]);
      }
    }
    T* crow = c + i * n;
    for (std::int64_t j = 0; j < n; ++j) {
      // beta == 0 ignores C entirely (it may hold NaN), as BLAS does.
      const double prior = beta == T(0) ? 0.0 : double(beta) * double(crow[j]);
      crow[j] = static_cast<T>(double(alpha) * row[j] + prior);
    }
  }
}

template <class T>
void gemm_batched(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  std::int64_t batch, T alpha, const T* a, const T* b, T beta, T* c) {
  for (std::int64_t i = 0; i < batch; ++i) {
    gemm<T>(trans_a, trans_b, m, n, k, alpha, a + i * m * k, b + i * k * n, beta, c + i * m * n);
  }
}

template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          const float*, float, float*);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double,
                           const double*, const double*, double, double*);

template void gemm_batched<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                  std::int64_t, float, const float*, const float*, float, float*);
template void gemm_batched<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t,
                                   std::int64_t, double, const double*, const double*, double,
                                   double*);

}  // namespace graphward::kernels::cpu
