// CPU references of the normalization and embedding kernels.
#include <cmath>
#include <limits>

#include "graphward/kernels/cpu_store.h"
#include "graphward/kernels/norm.h"

namespace graphward::kernels::cpu {
using detail::store;

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b,
                        std::int64_t rows, std::int64_t cols, T eps) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * cols;
    double s = 0;
    for (std::int64_t j = 0; j < cols; ++j) s += xr[j];
    const double m = s / static_cast<double>(cols);
    double v = 0;
    for (std::int64_t j = 0; j < cols; ++j) v += (xr[j] - m) * (xr[j] - m);
    const double r = 1.0 / std::sqrt(v / static_cast<double>(cols) + static_cast<double>(eps));
    mean[i] = static_cast<T>(m);
    rstd[i] = static_cast<T>(r);
    for (std::int64_t j = 0; j < cols; ++j) {
      const T xh = static_cast<T>((xr[j] - m) * r);
      y[i * cols + j] = xh * w[j] + (b ? b[j] : T(0));
    }
  }
}

template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* /*mean*/,
                         const T* rstd, const T* w, std::int64_t rows, std::int64_t cols,
                         bool accumulate_x, bool accumulate_w, bool accumulate_b) {
  if (dw && !accumulate_w) {
    for (std::int64_t j = 0; j < cols; ++j) dw[j] = T(0);
  }
  if (db && !accumulate_b) {
    for (std::int64_t j = 0; j < cols; ++j) db[j] = T(0);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * cols;
    const T* dyr = dy + i * cols;
    // x̂ as the forward made it: from the row's mean in double, recomputed here, not from the saved
    // mean rounded to T (rows of 1000 ± 0.01 gave a dx 1.5% off in float32).
    double s = 0;
    for (std::int64_t j = 0; j < cols; ++j) s += xr[j];
    const double m = s / static_cast<double>(cols);
    double sg = 0, sgx = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xh = (xr[j] - m) * rstd[i];
      const double g = static_cast<double>(dyr[j]) * w[j];
      sg += g;
      sgx += g * xh;
      if (dw) dw[j] += static_cast<T>(dyr[j] * xh);
      if (db) db[j] += dyr[j];
    }
    const double mg = sg / static_cast<double>(cols), mgx = sgx / static_cast<double>(cols);
    if (!dx) continue;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xh = (xr[j] - m) * rstd[i];
      const double g = static_cast<double>(dyr[j]) * w[j];
      store(dx, i * cols + j, static_cast<T>(rstd[i] * (g - mg - xh * mgx)), accumulate_x);
    }
  }
}

template <class T>
void embedding_forward(T* y, const T* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t dim) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t id = ids[i];
    for (std::int64_t j = 0; j < dim; ++j) {
      y[i * dim + j] = (id >= 0 && id < vocab) ? table[id * dim + j]
                                               : std::numeric_limits<T>::quiet_NaN();
    }
  }
}

template <class T>
void embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate) {
  if (!accumulate) {
    for (std::int64_t k = 0; k < vocab * dim; ++k) dtable[k] = T(0);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t id = ids[i];
    if (id < 0 || id >= vocab) continue;
    for (std::int64_t j = 0; j < dim; ++j) dtable[id * dim + j] += dy[i * dim + j];
  }
}

#define GW_INSTANTIATE(T)                                                                       \
  template void layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,   \
                                      std::int64_t, T);                                         \
  template void layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,      \
                                       const T*, std::int64_t, std::int64_t, bool, bool, bool); \
  template void embedding_forward<T>(T*, const T*, const std::int32_t*, std::int64_t,           \
                                     std::int64_t, std::int64_t);                               \
  template void embedding_backward<T>(T*, const T*, const std::int32_t*, std::int64_t,          \
                                      std::int64_t, std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
