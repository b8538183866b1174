// CPU references of the softmax kernels (the CPU backend and the test oracle).
#include <algorithm>
#include <cmath>
#include <limits>

#include "graphward/kernels/cpu_store.h"
#include "graphward/kernels/softmax.h"

namespace graphward::kernels::cpu {
using detail::store;

namespace {
// A row's log Σ exp in two parts (softmax.h): its maximum m and log Σ exp(x − m). Each output is
// (x − m) − log Σ: m + log Σ rounded to T and subtracted afterwards loses x's low digits at large
// magnitudes (logits 1e7 + [0, 1, 2, 3] gave a softmax summing to 1.55).
template <class T>
struct RowLse {
  T max, log_sum;
};
template <class T>
RowLse<T> row_lse(const T* x, std::int64_t cols) {
  T m = x[0];
  for (std::int64_t j = 1; j < cols; ++j) m = x[j] > m ? x[j] : m;
  double s = 0;
  for (std::int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(x[j] - m));
  return {m, static_cast<T>(std::log(s))};
}

// One row: the (log-)softmax of its first `kept` columns, 0 past them.
template <class T>
void softmax_row(T* y, const T* x, std::int64_t cols, std::int64_t kept, bool log) {
  const RowLse<T> r = row_lse(x, kept);
  for (std::int64_t j = 0; j < kept; ++j) {
    const T v = (x[j] - r.max) - r.log_sum;
    y[j] = log ? v : std::exp(v);
  }
  for (std::int64_t j = kept; j < cols; ++j) y[j] = T(0);
}
}  // namespace

template <class T>
void softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t cols, bool log) {
  for (std::int64_t i = 0; i < rows; ++i) softmax_row(y + i * cols, x + i * cols, cols, cols, log);
}

template <class T>
void causal_softmax_forward(T* y, const T* x, std::int64_t rows, std::int64_t cols,
                            std::int64_t queries) {
  for (std::int64_t i = 0; i < rows; ++i) {
    softmax_row(y + i * cols, x + i * cols, cols, std::min(cols, i % queries + 1), false);
  }
}

template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, std::int64_t rows, std::int64_t cols,
                      bool log, bool accumulate) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* dyr = dy + i * cols;
    const T* yr = y + i * cols;
    double s = 0;
    for (std::int64_t j = 0; j < cols; ++j) s += log ? dyr[j] : dyr[j] * yr[j];
    for (std::int64_t j = 0; j < cols; ++j) {
      const T g = log ? dyr[j] - std::exp(yr[j]) * static_cast<T>(s)
                      : yr[j] * (dyr[j] - static_cast<T>(s));
      store(dx, i * cols + j, g, accumulate);
    }
  }
}

template <class T>
void cross_entropy_forward(T* loss, T* lse, const T* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  double total = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const RowLse<T> r = row_lse(x + i * ld, cols);
    lse[2 * i] = r.max;
    lse[2 * i + 1] = r.log_sum;
    const std::int32_t t = target[i];
    total += (t >= 0 && t < cols)
                 ? static_cast<double>(r.max - x[i * ld + t]) + static_cast<double>(r.log_sum)
                 : std::numeric_limits<double>::quiet_NaN();
  }
  loss[0] = static_cast<T>(total / static_cast<double>(rows));
}

template <class T>
void cross_entropy_backward(T* dx, const T* dloss, const T* x, const T* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, bool accumulate) {
  const T scale = dloss[0] / static_cast<T>(rows);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const T p = std::exp((x[i * ld + j] - lse[2 * i]) - lse[2 * i + 1]);
      store(dx, i * ld + j, (p - (j == target[i] ? T(1) : T(0))) * scale, accumulate);
    }
    if (!accumulate) {  // padding columns: no gradient
      for (std::int64_t j = cols; j < ld; ++j) dx[i * ld + j] = T(0);
    }
  }
}

#define GW_INSTANTIATE(T)                                                                      \
  template void softmax_forward<T>(T*, const T*, std::int64_t, std::int64_t, bool);            \
  template void causal_softmax_forward<T>(T*, const T*, std::int64_t, std::int64_t,           \
                                          std::int64_t);                                       \
  template void softmax_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, bool,  \
                                    bool);                                                     \
  template void cross_entropy_forward<T>(T*, T*, const T*, const std::int32_t*, std::int64_t,  \
                                         std::int64_t, std::int64_t);                          \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const T*,                    \
                                          const std::int32_t*, std::int64_t, std::int64_t,     \
                                          std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
