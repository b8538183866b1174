#pragma once
// One unit (row r, column j) of the LSTM and GRU cells' pointwise work (contract in rnn.h), shared
// by the CUDA kernels (rnn.cu) and the CPU reference (rnn_cpu.cpp): the same arithmetic in the same
// order on both, written once. `z` / `a` point at the unit's first gate in its row of the gates;
// the others are `hidden` apart.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GW_RNN_HD __host__ __device__
#else
#define GW_RNN_HD
#endif

namespace graphward::kernels::detail {

template <class T>
GW_RNN_HD inline T rnn_tanh(T v) {
#if defined(__CUDA_ARCH__)
  return tanhf(v);
#else
  return std::tanh(v);
#endif
}
template <class T>
GW_RNN_HD inline T rnn_sigmoid(T v) {  // exp of a large argument is inf: 1 / inf = 0, no NaN
#if defined(__CUDA_ARCH__)
  return 1.f / (1.f + expf(-v));
#else
  return T(1) / (T(1) + std::exp(-v));
#endif
}

// LSTM forward: z's four gates (+ the biases' column j, where given) become i, f, g, o; returns
// c' = f·c + i·g and stores h' = o·tanh(c') in *h_out.
template <class T>
GW_RNN_HD inline T lstm_unit_forward(T* z, std::int64_t hidden, const T* b_ih, const T* b_hh,
                                     std::int64_t j, T c, T* h_out) {
  T v[4];
  for (int k = 0; k < 4; ++k) {
    v[k] = z[k * hidden];
    if (b_ih) v[k] += b_ih[k * hidden + j];
    if (b_hh) v[k] += b_hh[k * hidden + j];
  }
  const T i = rnn_sigmoid(v[0]), f = rnn_sigmoid(v[1]), g = rnn_tanh(v[2]), o = rnn_sigmoid(v[3]);
  const T cn = f * c + i * g;
  *h_out = o * rnn_tanh(cn);
  z[0] = i;
  z[hidden] = f;
  z[2 * hidden] = g;
  z[3 * hidden] = o;
  return cn;
}

// LSTM backward: from the activations a (i, f, g, o), the gradients dh and dc reaching h' and c',
// c and c', writes dz's four gates; returns the gradient of c, dc*·f.
template <class T>
GW_RNN_HD inline T lstm_unit_backward(T* dz, const T* a, std::int64_t hidden, T dh, T dc, T c,
                                      T c_new) {
  const T i = a[0], f = a[hidden], g = a[2 * hidden], o = a[3 * hidden];
  const T t = rnn_tanh(c_new);
  const T dcs = dc + dh * o * (T(1) - t * t);
  dz[0] = dcs * g * i * (T(1) - i);
  dz[hidden] = dcs * c * f * (T(1) - f);
  dz[2 * hidden] = dcs * i * (T(1) - g * g);
  dz[3 * hidden] = dh * t * o * (T(1) - o);
  return dcs * f;
}

// GRU forward: from x3 and h3 (the unit's three gates of gx and gh, without biases) and h, writes
// a's four entries (r, z, n, hn); returns h'.
template <class T>
GW_RNN_HD inline T gru_unit_forward(T* a, const T* x3, const T* h3, std::int64_t hidden,
                                    const T* b_ih, const T* b_hh, std::int64_t j, T h) {
  T vx[3], vh[3];
  for (int k = 0; k < 3; ++k) {
    vx[k] = x3[k * hidden] + (b_ih ? b_ih[k * hidden + j] : T(0));
    vh[k] = h3[k * hidden] + (b_hh ? b_hh[k * hidden + j] : T(0));
  }
  const T rg = rnn_sigmoid(vx[0] + vh[0]), z = rnn_sigmoid(vx[1] + vh[1]);
  const T n = rnn_tanh(vx[2] + rg * vh[2]);
  a[0] = rg;
  a[hidden] = z;
  a[2 * hidden] = n;
  a[3 * hidden] = vh[2];
  return (T(1) - z) * n + z * h;
}

// GRU backward: from a (r, z, n, hn), h and the gradient d reaching h', writes the unit's three
// gates of dgx and dgh; returns h's direct part d·z.
template <class T>
GW_RNN_HD inline T gru_unit_backward(T* x3, T* h3, const T* a, std::int64_t hidden, T d, T h) {
  const T rg = a[0], z = a[hidden], n = a[2 * hidden], hn = a[3 * hidden];
  const T dz = d * (h - n) * z * (T(1) - z);
  const T dn = d * (T(1) - z) * (T(1) - n * n);
  const T dr = dn * hn * rg * (T(1) - rg);
  x3[0] = dr;
  x3[hidden] = dz;
  x3[2 * hidden] = dn;
  h3[0] = dr;
  h3[hidden] = dz;
  h3[2 * hidden] = dn * rg;
  return d * z;
}

}  // namespace graphward::kernels::detail
