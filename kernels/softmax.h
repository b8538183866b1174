#pragma once
// Softmax, log-softmax and cross-entropy over the last dimension of a [rows, cols] matrix, forward
// and backward, with CPU references. Same launcher contract as elementwise.h. Numerically stable
// at any magnitude: a row's log Σ exp is kept in two parts, its maximum m and log Σ exp(x − m),
// and every log-softmax output is (x − m) − log Σ exp(x − m), every softmax output exp(x − m) /
// Σ exp(x − m) — x − m is exact where it matters, near the maximum — never x minus their rounded
// sum; row sums in a fixed order, so results are deterministic.
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// S: float or bf16 (bfloat16 storage: loads widened, arithmetic and the row statistics in float32,
// each output rounded once when stored). Cross-entropy's loss, statistics and dloss are float32
// whatever the logits' storage.
// y = softmax(x) / log_softmax(x) per row
template <class S>
void softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols, cudaStream_t stream);
template <class S>
void log_softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                         cudaStream_t stream);
// Causal softmax: the rows as matrices of `queries` rows each (attention's scores [.., Tq, Tk],
// queries = Tq); row r keeps its columns j ≤ r mod queries — a query attends to the keys up to its
// own position, aligned at the top left as PyTorch's is_causal — and the others are 0 (neither
// read nor summed). Its backward is softmax_backward's (a 0 of y has a 0 gradient).
template <class S>
void causal_softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                            std::int64_t queries, cudaStream_t stream);
// dx = y ⊙ (dy − Σ_j dy_j y_j)  (y: softmax's output)
template <class S>
void softmax_backward(S* dx, const S* dy, const S* y, std::int64_t rows, std::int64_t cols,
                      bool accumulate, cudaStream_t stream);
// dx = dy − exp(y) · Σ_j dy_j  (y: log_softmax's output)
template <class S>
void log_softmax_backward(S* dx, const S* dy, const S* y, std::int64_t rows, std::int64_t cols,
                          bool accumulate, cudaStream_t stream);
// Rows of ld elements, the first cols of each the classes (cols <= ld; the rest take no part):
// lse[2i] = m_i = max_{j < cols} x[i, j], lse[2i + 1] = log Σ_{j < cols} exp(x[i, j] − m_i)
// (lse: [rows, 2]); loss[0] = mean_i ((m_i − x[i, target[i]]) + lse[2i + 1]). A target outside
// [0, cols) makes the loss NaN (no host read to refuse it).
template <class S>
void cross_entropy_forward(float* loss, float* lse, const S* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           cudaStream_t stream);
// dx[i, j] = (exp((x[i, j] − lse[2i]) − lse[2i + 1]) − [j == target[i]]) · dloss[0] / rows for
// j < cols, 0 for cols <= j < ld (left as it is when accumulating).
template <class S>
void cross_entropy_backward(S* dx, const float* dloss, const S* x, const float* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, bool accumulate, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t cols, bool log);
template <class T>
void causal_softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t cols,
                            std::int64_t queries);
template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, std::int64_t rows, std::int64_t cols,
                      bool log, bool accumulate);
template <class T>
void cross_entropy_forward(T* loss, T* lse, const T* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, std::int64_t ld);
template <class T>
void cross_entropy_backward(T* dx, const T* dloss, const T* x, const T* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
