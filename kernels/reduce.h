#pragma once
// Reductions and the losses built on them, forward and backward side by side, each with its CPU
// reference. Same launcher contract as elementwise.h. Sums accumulate in double and in a fixed
// order, so results are deterministic run to run (bitwise) and accurate for long vectors.
//
// A scalar result lives in device memory (a 1-element buffer) and backward launchers read the
// incoming scalar gradient from device memory: nothing here reads back to the host.
#include <cstdint>
#include "graphward/base/config.h"

#include "graphward/base/dtype.h"  // bf16

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// S: float or bf16, the storage of x, pred, target and their gradients; a scalar (out, dy) is
// float32 either way (a bfloat16 tensor's sum or loss keeps float32 math and storage).
// out[0] = scale * Σ x[i]  (sum: scale = 1; mean: scale = 1/n)
template <class S>
void sum_forward(float* out, const S* x, float scale, std::int64_t n, cudaStream_t stream);
// dx[i] = scale * dy[0]
template <class S>
void sum_backward(S* dx, const float* dy, float scale, std::int64_t n, bool accumulate,
                  cudaStream_t stream);
// dst[j] = alpha * Σ_i src[i,j] * (other ? other[i,j] : 1) over rows i of an [rows, cols] matrix:
// the gradient of a row-broadcast operand (a bias). T: float or bf16 (summed in double either way).
template <class T>
void column_sum(T* dst, const T* src, const T* other, float alpha, std::int64_t rows,
                std::int64_t cols, bool accumulate, cudaStream_t stream);
// The same of a bfloat16 matrix into float32 sums, stored unrounded (a float32 parameter's bias
// gradient from its bfloat16 copy's, Note [Autocast]).
void column_sum(float* dst, const bf16* src, float alpha, std::int64_t rows, std::int64_t cols,
                bool accumulate, cudaStream_t stream);
// out[0] = Σ (pred[i] - target[i])² / n
template <class S>
void mse_loss_forward(float* out, const S* pred, const S* target, std::int64_t n,
                      cudaStream_t stream);
// g = 2 (pred[i] - target[i]) / n * dy[0];  dpred = g, dtarget = -g. Either output may be null.
template <class S>
void mse_loss_backward(S* dpred, S* dtarget, const float* dy, const S* pred, const S* target,
                       std::int64_t n, bool accumulate_pred, bool accumulate_target,
                       cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void sum_forward(T* out, const T* x, T scale, std::int64_t n);
template <class T>
void sum_backward(T* dx, const T* dy, T scale, std::int64_t n, bool accumulate);
template <class T>
void column_sum(T* dst, const T* src, const T* other, T alpha, std::int64_t rows, std::int64_t cols,
                bool accumulate);
template <class T>
void mse_loss_forward(T* out, const T* pred, const T* target, std::int64_t n);
template <class T>
void mse_loss_backward(T* dpred, T* dtarget, const T* dy, const T* pred, const T* target,
                       std::int64_t n, bool accumulate_pred, bool accumulate_target);
}  // namespace cpu

}  // namespace graphward::kernels
