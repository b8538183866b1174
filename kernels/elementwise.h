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

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul };

#if GRAPHWARD_HAS_CUDA
void fill(float* y, float value, std::int64_t n, cudaStream_t stream);  // y = value

void relu_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream);
void relu_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * (y > 0)
void tanh_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream);
void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * (1 - y²)
void sigmoid_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream);
void sigmoid_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                      cudaStream_t stream);  // dx = dy * y * (1 - y)
// GELU, tanh approximation (the form cuBLASLt's GELU epilogues compute, PyTorch's
// gelu(approximate="tanh")): y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x³))). Its backward
// reads the input x, not y.
void gelu_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream);
void gelu_backward(float* dx, const float* dy, const float* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream);  // dx = dy * gelu'(x)

// narrow's backward (its forward: gather_window, shape.h). dx [rows, cols]: dy in the window; outside it 0 (written) or unchanged (accumulate).
void narrow_backward(float* dx, const float* dy, std::int64_t rows, std::int64_t cols,
                     std::int64_t start, std::int64_t len, bool accumulate, cudaStream_t stream);

// y[i] = a[i % a_period] (op) b[i % b_period]
void binary_forward(BinaryOp op, float* y, const float* a, std::int64_t a_period, const float* b,
                    std::int64_t b_period, std::int64_t n, cudaStream_t stream);
// y = alpha * x + beta (the scalar forms of add, sub and mul)
void affine_forward(float* y, const float* x, float alpha, float beta, std::int64_t n,
                    cudaStream_t stream);
// dx = alpha * dy: backward of add/sub for a full-shape operand and of the scalar forms
void scale_backward(float* dx, const float* dy, float alpha, std::int64_t n, bool accumulate,
                    cudaStream_t stream);
// dx = dy * other[i % other_period]: backward of mul for a full-shape operand
void mul_backward(float* dx, const float* dy, const float* other, std::int64_t other_period,
                  std::int64_t n, bool accumulate, cudaStream_t stream);
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
