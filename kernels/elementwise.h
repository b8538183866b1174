#pragma once
// Elementwise ops, forward and backward side by side, each with its CPU reference.
//
// Contract (all launchers): outputs first, then inputs, then sizes, then the stream. Launchers
// never allocate, never synchronize and check their launch, so each is safe to capture.
// Backward launchers write their gradient (`accumulate` = false: dx = ...) or add to it
// (`accumulate` = true: dx += ...). A forward output may be its own input (y == x: in place), and
// an activation's backward may write over its incoming gradient (dx == dy).
//
// Broadcasting: a binary operand is read at index i % period, where period is n (same shape as the
// output), the last dimension (a row broadcast over the rows) or 1 (a single element).
#include <cstdint>
#include "graphward/base/config.h"

#include "graphward/base/dtype.h"  // bf16

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul };

#if GRAPHWARD_HAS_CUDA
// T: float (float32) or bf16 (bfloat16 storage, float32 arithmetic: loaded as float32, stored
// rounded to nearest even; an accumulating store adds in float32, then rounds).
template <class T>
void fill(T* y, float value, std::int64_t n, cudaStream_t stream);  // y = value

// y = x > 0 ? x : 0, and NaN where x is NaN (cuBLASLt's ReLU epilogue and PyTorch keep it).
template <class T>
void relu_forward(T* y, const T* x, std::int64_t n, cudaStream_t stream);
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * (y > 0)
template <class T>
void tanh_forward(T* y, const T* x, std::int64_t n, cudaStream_t stream);
template <class T>
void tanh_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * (1 - y²)
template <class T>
void sigmoid_forward(T* y, const T* x, std::int64_t n, cudaStream_t stream);
template <class T>
void sigmoid_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate,
                      cudaStream_t stream);  // dx = dy * y * (1 - y)
// GELU, tanh approximation (the form cuBLASLt's GELU epilogues compute, PyTorch's
// gelu(approximate="tanh")): y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x³))). Its backward
// reads the input x, not y.
template <class T>
void gelu_forward(T* y, const T* x, std::int64_t n, cudaStream_t stream);
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * gelu'(x)

// narrow's backward (its forward: gather_window, shape.h). dx [rows, cols]: dy in the window; outside it 0 (written) or unchanged (accumulate).
template <class T>
void narrow_backward(T* dx, const T* dy, std::int64_t rows, std::int64_t cols, std::int64_t start,
                     std::int64_t len, bool accumulate, cudaStream_t stream);

// y[i] = a[i % a_period] (op) b[i % b_period]
template <class T>
void binary_forward(BinaryOp op, T* y, const T* a, std::int64_t a_period, const T* b,
                    std::int64_t b_period, std::int64_t n, cudaStream_t stream);
// y = alpha * x + beta (the scalar forms of add, sub and mul)
template <class T>
void affine_forward(T* y, const T* x, float alpha, float beta, std::int64_t n,
                    cudaStream_t stream);
// dx = alpha * dy: backward of add/sub for a full-shape operand and of the scalar forms
template <class T>
void scale_backward(T* dx, const T* dy, float alpha, std::int64_t n, bool accumulate,
                    cudaStream_t stream);
// dx = dy * other[i % other_period]: backward of mul for a full-shape operand
template <class T>
void mul_backward(T* dx, const T* dy, const T* other, std::int64_t other_period, std::int64_t n,
                  bool accumulate, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void fill(T* y, T value, std::int64_t n);
template <class T>
void relu_forward(T* y, const T* x, std::int64_t n);
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate);
template <class T>
void tanh_forward(T* y, const T* x, std::int64_t n);
template <class T>
void tanh_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate);
template <class T>
void sigmoid_forward(T* y, const T* x, std::int64_t n);
template <class T>
void sigmoid_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate);
template <class T>
void gelu_forward(T* y, const T* x, std::int64_t n);
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, std::int64_t n, bool accumulate);
template <class T>
void narrow_backward(T* dx, const T* dy, std::int64_t rows, std::int64_t cols, std::int64_t start,
                     std::int64_t len, bool accumulate);
template <class T>
void binary_forward(BinaryOp op, T* y, const T* a, std::int64_t a_period, const T* b,
                    std::int64_t b_period, std::int64_t n);
template <class T>
void affine_forward(T* y, const T* x, T alpha, T beta, std::int64_t n);
template <class T>
void scale_backward(T* dx, const T* dy, T alpha, std::int64_t n, bool accumulate);
template <class T>
void mul_backward(T* dx, const T* dy, const T* other, std::int64_t other_period, std::int64_t n,
                  bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
