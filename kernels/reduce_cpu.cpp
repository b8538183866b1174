// CPU references of the reductions and losses (the CPU backend and the test oracle).
#include "graphward/kernels/cpu_store.h"
#include "graphward/kernels/reduce.h"

namespace graphward::kernels::cpu {
using detail::store;

template <class T>
void sum_forward(T* out, const T* x, T scale, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc += x[i];
  out[0] = static_cast<T>(acc * double(scale));
}
template <class T>
void sum_backward(T* dx, const T* dy, T scale, std::int64_t n, bool accumulate) {
  const T g = scale * dy[0];
  for (std::int64_t i = 0; i < n; ++i) store(dx, i, g, accumulate);
}
template <class T>
void column_sum(T* dst, const T* src, const T* other, T alpha, std::int64_t rows, std::int64_t cols,
                bool accumulate) {
  for (std::int64_t c = 0; c < cols; ++c) {
    double acc = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r * cols + c;
      acc += other ? double(src[i]) * double(other[i]) : double(src[i]);
    }
    store(dst, c, static_cast<T>(double(alpha) * acc), accumulate);
  }
}
template <class T>
void mse_loss_forward(T* out, const T* pred, const T* target, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = double(pred[i]) - double(target[i]);
    acc += d * d;
  }
  out[0] = static_cast<T>(acc / double(n));
}
template <class T>
void mse_loss_backward(T* dpred, T* dtarget, const T* dy, const T* pred, const T* target,
                       std::int64_t n, bool accumulate_pred, bool accumulate_target) {
  const T scale = T(2) * dy[0] / static_cast<T>(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = scale * (pred[i] - target[i]);
    if (dpred) store(dpred, i, g, accumulate_pred);
    if (dtarget) store(dtarget, i, -g, accumulate_target);
  }
}

#define GW_INSTANTIATE(T)                                                                      \
  template void sum_forward<T>(T*, const T*, T, std::int64_t);                                 \
  template void sum_backward<T>(T*, const T*, T, std::int64_t, bool);                          \
  template void column_sum<T>(T*, const T*, const T*, T, std::int64_t, std::int64_t, bool);    \
  template void mse_loss_forward<T>(T*, const T*, const T*, std::int64_t);                     \
  template void mse_loss_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t, bool, \
                                     bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
