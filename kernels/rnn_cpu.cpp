// The LSTM cell's pointwise work on the CPU: the reference for kernels/rnn.cu (contract in rnn.h),
// the same arithmetic in the same order per element.
#include <cmath>

#include "graphward/kernels/rnn.h"

namespace graphward::kernels::cpu {
namespace {
template <class T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}
}  // namespace

template <class T>
void lstm_cell_forward(T* gates, T* out, const T* c, const T* b_ih, const T* b_hh,
                       std::int64_t batch, std::int64_t hidden) {
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t e = r * hidden + j;
      T* z = gates + r * 4 * hidden + j;
      T v[4];
      for (int k = 0; k < 4; ++k) {
        v[k] = z[k * hidden];
        if (b_ih) v[k] += b_ih[k * hidden + j];
        if (b_hh) v[k] += b_hh[k * hidden + j];
      }
      const T i = sigmoid(v[0]), f = sigmoid(v[1]), g = std::tanh(v[2]), o = sigmoid(v[3]);
      const T cn = f * c[e] + i * g;
      out[e] = o * std::tanh(cn);
      out[batch * hidden + e] = cn;
      z[0] = i;
      z[hidden] = f;
      z[2 * hidden] = g;
      z[3 * hidden] = o;
    }
  }
}

template <class T>
void lstm_cell_backward(T* dgates, T* dc, const T* grad_out, const T* act, const T* c,
                        const T* c_new, std::int64_t batch, std::int64_t hidden, bool accumulate) {
  const std::int64_t n = batch * hidden;
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t e = r * hidden + j;
      const T* a = act + r * 4 * hidden + j;
      const T i = a[0], f = a[hidden], g = a[2 * hidden], o = a[3 * hidden];
      const T dh = grad_out[e], t = std::tanh(c_new[e]);
      const T dcs = grad_out[n + e] + dh * o * (T(1) - t * t);
      T* dz = dgates + r * 4 * hidden + j;
      dz[0] = dcs * g * i * (T(1) - i);
      dz[hidden] = dcs * c[e] * f * (T(1) - f);
      dz[2 * hidden] = dcs * i * (T(1) - g * g);
      dz[3 * hidden] = dh * t * o * (T(1) - o);
      if (dc) dc[e] = accumulate ? dc[e] + dcs * f : dcs * f;
    }
  }
}

#define GW_INSTANTIATE(T)                                                                         \
  template void lstm_cell_forward<T>(T*, T*, const T*, const T*, const T*, std::int64_t,          \
                                     std::int64_t);                                               \
  template void lstm_cell_backward<T>(T*, T*, const T*, const T*, const T*, const T*,             \
                                      std::int64_t, std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
