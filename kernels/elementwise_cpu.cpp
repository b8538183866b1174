// CPU references of the elementwise ops (the CPU backend and the test oracle).
#include <cmath>

#include "graphward/kernels/cpu_store.h"
#include "graphward/kernels/elementwise.h"

namespace graphward::kernels::cpu {
using detail::store;

template <class T>
void fill(T* y, T value, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = value;
}
template <class T>
void relu_forward(T* y, const T* x, std::int64_t n) {
  // NaN stays NaN, as cuBLASLt's ReLU epilogue and PyTorch give (x > 0 dropped it).
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) || std::isnan(x[i]) ? x[i] : T(0);
}
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, y[i] > T(0) ? dy[i] : T(0), accumulate);
}
template <class T>
void tanh_forward(T* y, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
template <class T>
void tanh_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, dy[i] * (T(1) - y[i] * y[i]), accumulate);
}
template <class T>
void sigmoid_forward(T* y, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}
template <class T>
void sigmoid_backward(T* dx, const T* dy, const T* y, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, dy[i] * y[i] * (T(1) - y[i]), accumulate);
}
template <class T>
void gelu_forward(T* y, const T* x, std::int64_t n) {
  const T c = T(0.7978845608028654), a = T(0.044715);
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::tanh(c * (v + a * v * v * v)));
  }
}
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, std::int64_t n, bool accumulate) {
  const T c = T(0.7978845608028654), a = T(0.044715);
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = std::tanh(c * (v + a * v * v * v));
    const T d = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * c * (T(1) + T(3) * a * v * v);
    store(dx, i, dy[i] * d, accumulate);
  }
}
template <class T>
void narrow_backward(T* dx, const T* dy, std::int64_t rows, std::int64_t cols, std::int64_t start,
                     std::int64_t len, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const bool inside = j >= start && j < start + len;
      if (accumulate) {
        if (inside) dx[r * cols + j] += dy[r * len + (j - start)];
      } else {
        dx[r * cols + j] = inside ? dy[r * len + (j - start)] : T(0);
      }
    }
  }
}
template <class T>
void binary_forward(BinaryOp op, T* y, const T* a, std::int64_t a_period, const T* b,
                    std::int64_t b_period, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T av = a[i % a_period];
    const T bv = b[i % b_period];
    y[i] = op == BinaryOp::kAdd ? av + bv : op == BinaryOp::kSub ? av - bv : av * bv;
  }
}
template <class T>
void affine_forward(T* y, const T* x, T alpha, T beta, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + beta;
}
template <class T>
void scale_backward(T* dx, const T* dy, T alpha, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, alpha * dy[i], accumulate);
}
template <class T>
void mul_backward(T* dx, const T* dy, const T* other, std::int64_t other_period, std::int64_t n,
                  bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, dy[i] * other[i % other_period], accumulate);
}

#define GW_INSTANTIATE(T)                                                                       \
  template void fill<T>(T*, T, std::int64_t);                                                   \
  template void relu_forward<T>(T*, const T*, std::int64_t);                                    \
  template void relu_backward<T>(T*, const T*, const T*, std::int64_t, bool);                   \
  template void tanh_forward<T>(T*, const T*, std::int64_t);                                    \
  template void tanh_backward<T>(T*, const T*, const T*, std::int64_t, bool);                   \
  template void sigmoid_forward<T>(T*, const T*, std::int64_t);                                 \
  template void sigmoid_backward<T>(T*, const T*, const T*, std::int64_t, bool);                \
  template void gelu_forward<T>(T*, const T*, std::int64_t);                                    \
  template void narrow_backward<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,       \
                                   std::int64_t, bool);                                         \
  template void gelu_backward<T>(T*, const T*, const T*, std::int64_t, bool);                   \
  template void binary_forward<T>(BinaryOp, T*, const T*, std::int64_t, const T*, std::int64_t, \
                                  std::int64_t);                                                \
  template void affine_forward<T>(T*, const T*, T, T, std::int64_t);                            \
  template void scale_backward<T>(T*, const T*, T, std::int64_t, bool);                         \
  template void mul_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
