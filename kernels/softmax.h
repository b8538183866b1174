#pragma once
// Softmax, log-softmax and cross-entropy over the last dimension of a [rows, cols] matrix, forward
// and backward, with CPU references. Same launcher contract as elementwise.h. Numerically stable
// (the row's maximum is subtracted before exponentiating); row sums in a fixed order, so results
// are deterministic.
#include <cstdint>
#include "base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// y = softmax(x) / log_softmax(x) per row
void softmax_forward(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream);
void log_softmax_forward(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                         cudaStream_t stream);
// dx = y ⊙ (dy − Σ_j dy_j y_j)  (y: softmax's output)
void softmax_backward(float* dx, const float* dy, const float* y, std::int64_t rows,
                      std::int64_t cols, bool accumulate, cudaStream_t stream);
// dx = dy − exp(y) · Σ_j dy_j  (y: log_softmax's output)
void log_softmax_backward(float* dx, const float* dy, const float* y, std::int64_t rows,
                          std::int64_t cols, bool accumulate, cudaStream_t stream);
// lse[i] = log Σ_j exp(x[i, j]); loss[0] = mean_i (lse[i] − x[i, target[i]]). A target outside
// [0, cols) makes the loss NaN (no host read to refuse it).
void cross_entropy_forward(float* loss, float* lse, const float* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, cudaStream_t stream);
// dx[i, j] = (exp(x[i, j] − lse[i]) − [j == target[i]]) · dloss[0] / rows
void cross_entropy_backward(float* dx, const float* dloss, const float* x, const float* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            bool accumulate, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t cols, bool log);
template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, std::int64_t rows, std::int64_t cols,
                      bool log, bool accumulate);
template <class T>
void cross_entropy_forward(T* loss, T* lse, const T* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols);
template <class T>
void cross_entropy_backward(T* dx, const T* dloss, const T* x, const T* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
