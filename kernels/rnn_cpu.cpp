// The LSTM and GRU cells' pointwise work on the CPU: the reference for kernels/rnn.cu (contract in
// rnn.h), the same arithmetic in the same order per element.
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
void lstm_cell_forward(T* gates, T* h_out, T* c_out, const T* c, const T* b_ih, const T* b_hh,
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
      h_out[e] = o * std::tanh(cn);
      c_out[e] = cn;
      z[0] = i;
      z[hidden] = f;
      z[2 * hidden] = g;
      z[3 * hidden] = o;
    }
  }
}

template <class T>
void lstm_cell_backward(T* dgates, T* dc, const T* dh_in, const T* dh_more, const T* dc_in,
                        const T* dc_more, const T* act, const T* c, const T* c_new,
                        std::int64_t batch, std::int64_t hidden, bool accumulate) {
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t e = r * hidden + j;
      const T* a = act + r * 4 * hidden + j;
      const T i = a[0], f = a[hidden], g = a[2 * hidden], o = a[3 * hidden];
      const T dh = dh_in[e] + (dh_more ? dh_more[e] : T(0));
      const T t = std::tanh(c_new[e]);
      const T dcs = dc_in[e] + (dc_more ? dc_more[e] : T(0)) + dh * o * (T(1) - t * t);
      T* dz = dgates + r * 4 * hidden + j;
      dz[0] = dcs * g * i * (T(1) - i);
      dz[hidden] = dcs * c[e] * f * (T(1) - f);
      dz[2 * hidden] = dcs * i * (T(1) - g * g);
      dz[3 * hidden] = dh * t * o * (T(1) - o);
      if (dc) dc[e] = accumulate ? dc[e] + dcs * f : dcs * f;
    }
  }
}

template <class T>
void gru_cell_forward(T* out, T* act, const T* gx, const T* gh, const T* h, const T* b_ih,
                      const T* b_hh, std::int64_t batch, std::int64_t hidden) {
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t e = r * hidden + j;
      const T* x3 = gx + r * 3 * hidden + j;
      const T* h3 = gh + r * 3 * hidden + j;
      T vx[3], vh[3];
      for (int k = 0; k < 3; ++k) {
        vx[k] = x3[k * hidden] + (b_ih ? b_ih[k * hidden + j] : T(0));
        vh[k] = h3[k * hidden] + (b_hh ? b_hh[k * hidden + j] : T(0));
      }
      const T rg = sigmoid(vx[0] + vh[0]), z = sigmoid(vx[1] + vh[1]);
      const T n = std::tanh(vx[2] + rg * vh[2]);
      out[e] = (T(1) - z) * n + z * h[e];
      T* a = act + r * 4 * hidden + j;
      a[0] = rg;
      a[hidden] = z;
      a[2 * hidden] = n;
      a[3 * hidden] = vh[2];
    }
  }
}

template <class T>
void gru_cell_backward(T* dgx, T* dgh, T* dh, const T* grad_out, const T* act, const T* h,
                       std::int64_t batch, std::int64_t hidden, bool accumulate) {
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t e = r * hidden + j;
      const T* a = act + r * 4 * hidden + j;
      const T rg = a[0], z = a[hidden], n = a[2 * hidden], hn = a[3 * hidden];
      const T d = grad_out[e];
      const T dz = d * (h[e] - n) * z * (T(1) - z);
      const T dn = d * (T(1) - z) * (T(1) - n * n);
      const T dr = dn * hn * rg * (T(1) - rg);
      T* x3 = dgx + r * 3 * hidden + j;
      T* h3 = dgh + r * 3 * hidden + j;
      x3[0] = dr;
      x3[hidden] = dz;
      x3[2 * hidden] = dn;
      h3[0] = dr;
      h3[hidden] = dz;
      h3[2 * hidden] = dn * rg;
      if (dh) dh[e] = accumulate ? dh[e] + d * z : d * z;
    }
  }
}

#define GW_INSTANTIATE(T)                                                                       \
  template void lstm_cell_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,    \
                                     std::int64_t);                                             \
  template void lstm_cell_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                      const T*, const T*, std::int64_t, std::int64_t, bool);    \
  template void gru_cell_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,   \
                                    std::int64_t, std::int64_t);                                \
  template void gru_cell_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,    \
                                     std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
