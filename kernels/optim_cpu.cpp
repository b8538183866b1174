// CPU references of the optimizer kernels (the CPU backend and the test oracle).
#include <cmath>

#include "graphward/kernels/optim.h"

namespace graphward::kernels::cpu {

template <class T>
void sgd_step(T* p, const T* grad, T* buf, std::int64_t n, T lr, double step, SgdParams hp) {
  const T momentum = T(hp.momentum), dampening = T(hp.dampening), wd = T(hp.weight_decay);
  for (std::int64_t i = 0; i < n; ++i) {
    T g = grad[i];
    if (wd != T(0)) g += wd * p[i];
    if (momentum != T(0)) {
      const T b = step == 0.0 ? g : momentum * buf[i] + (T(1) - dampening) * g;
      buf[i] = b;
      g = hp.nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
  }
}

template <class T>
void adamw_step(T* p, const T* grad, T* m, T* v, std::int64_t n, T lr, double step,
                AdamWParams hp) {
  const T b1 = T(hp.beta1), b2 = T(hp.beta2), eps = T(hp.eps), wd = T(hp.weight_decay);
  const double t = step + 1.0;
  const T c1 = static_cast<T>(1.0 - std::pow(static_cast<double>(hp.beta1), t));
  const T c2 = static_cast<T>(1.0 - std::pow(static_cast<double>(hp.beta2), t));
  const T sqrt_c2 = std::sqrt(c2);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T w = p[i] * (T(1) - lr * wd);
    m[i] = b1 * m[i] + (T(1) - b1) * g;
    v[i] = b2 * v[i] + (T(1) - b2) * g * g;
    w -= lr * (m[i] / c1) / (std::sqrt(v[i]) / sqrt_c2 + eps);
    p[i] = w;
  }
}

template <class T>
T sum_squares(const T* x, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return static_cast<T>(acc);
}

#define GW_INSTANTIATE(T)                                                                  \
  template void sgd_step<T>(T*, const T*, T*, std::int64_t, T, double, SgdParams);         \
  template void adamw_step<T>(T*, const T*, T*, T*, std::int64_t, T, double, AdamWParams); \
  template T sum_squares<T>(const T*, std::int64_t);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
