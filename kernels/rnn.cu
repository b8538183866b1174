// The LSTM and GRU cells' pointwise kernels: one thread per (row, unit) in a grid-stride loop, the
// gates of a unit read and written by that thread. Contract in rnn.h.
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/rnn.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;

__device__ __forceinline__ float sigmoid(float v) {
  return 1.f / (1.f + expf(-v));  // expf(large) = inf: 1 / inf = 0, no NaN
}

__global__ void lstm_cell_forward_kernel(float* gates, float* h_out, float* c_out, const float* c,
                                         const float* b_ih, const float* b_hh, std::int64_t batch,
                                         std::int64_t hidden) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    float* z = gates + r * 4 * hidden + j;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = z[k * hidden];
      if (b_ih) v[k] += b_ih[k * hidden + j];
      if (b_hh) v[k] += b_hh[k * hidden + j];
    }
    const float i = sigmoid(v[0]), f = sigmoid(v[1]), g = tanhf(v[2]), o = sigmoid(v[3]);
    const float cn = f * c[e] + i * g;
    h_out[e] = o * tanhf(cn);
    c_out[e] = cn;
    z[0] = i;
    z[hidden] = f;
    z[2 * hidden] = g;
    z[3 * hidden] = o;
  }
}

__global__ void lstm_cell_backward_kernel(float* dgates, float* dc, const float* dh_in,
                                          const float* dh_more, const float* dc_in,
                                          const float* dc_more, const float* act, const float* c,
                                          const float* c_new, std::int64_t batch,
                                          std::int64_t hidden, bool accumulate) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const float* a = act + r * 4 * hidden + j;
    const float i = a[0], f = a[hidden], g = a[2 * hidden], o = a[3 * hidden];
    const float dh = dh_in[e] + (dh_more ? dh_more[e] : 0.f);
    const float t = tanhf(c_new[e]);
    const float dcs = dc_in[e] + (dc_more ? dc_more[e] : 0.f) + dh * o * (1.f - t * t);
    float* dz = dgates + r * 4 * hidden + j;
    dz[0] = dcs * g * i * (1.f - i);
    dz[hidden] = dcs * c[e] * f * (1.f - f);
    dz[2 * hidden] = dcs * i * (1.f - g * g);
    dz[3 * hidden] = dh * t * o * (1.f - o);
    if (dc) detail::store(dc, e, dcs * f, accumulate);
  }
}

__global__ void gru_cell_forward_kernel(float* out, float* act, const float* gx, const float* gh,
                                        const float* h, const float* b_ih, const float* b_hh,
                                        std::int64_t batch, std::int64_t hidden) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const float* x3 = gx + r * 3 * hidden + j;
    const float* h3 = gh + r * 3 * hidden + j;
    float vx[3], vh[3];
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      vx[k] = x3[k * hidden] + (b_ih ? b_ih[k * hidden + j] : 0.f);
      vh[k] = h3[k * hidden] + (b_hh ? b_hh[k * hidden + j] : 0.f);
    }
    const float rg = sigmoid(vx[0] + vh[0]), z = sigmoid(vx[1] + vh[1]);
    const float n = tanhf(vx[2] + rg * vh[2]);
    out[e] = (1.f - z) * n + z * h[e];
    float* a = act + r * 4 * hidden + j;
    a[0] = rg;
    a[hidden] = z;
    a[2 * hidden] = n;
    a[3 * hidden] = vh[2];
  }
}

__global__ void gru_cell_backward_kernel(float* dgx, float* dgh, float* dh, const float* grad_out,
                                         const float* act, const float* h, std::int64_t batch,
                                         std::int64_t hidden, bool accumulate) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const float* a = act + r * 4 * hidden + j;
    const float rg = a[0], z = a[hidden], n = a[2 * hidden], hn = a[3 * hidden];
    const float d = grad_out[e];
    const float dz = d * (h[e] - n) * z * (1.f - z);
    const float dn = d * (1.f - z) * (1.f - n * n);
    const float dr = dn * hn * rg * (1.f - rg);
    float* x3 = dgx + r * 3 * hidden + j;
    float* h3 = dgh + r * 3 * hidden + j;
    x3[0] = dr;
    x3[hidden] = dz;
    x3[2 * hidden] = dn;
    h3[0] = dr;
    h3[hidden] = dz;
    h3[2 * hidden] = dn * rg;
    if (dh) detail::store(dh, e, d * z, accumulate);
  }
}

}  // namespace

void lstm_cell_forward(float* gates, float* h_out, float* c_out, const float* c, const float* b_ih,
                       const float* b_hh, std::int64_t batch, std::int64_t hidden,
                       cudaStream_t stream) {
  const std::int64_t n = batch * hidden;
  if (n == 0) return;
  lstm_cell_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(gates, h_out, c_out, c, b_ih, b_hh,
                                                                 batch, hidden);
  GW_LAUNCH_CHECK();
}

void lstm_cell_backward(float* dgates, float* dc, const float* dh, const float* dh_more,
                        const float* dc_in, const float* dc_more, const float* act, const float* c,
                        const float* c_new, std::int64_t batch, std::int64_t hidden,
                        bool accumulate, cudaStream_t stream) {
  const std::int64_t n = batch * hidden;
  if (n == 0) return;
  lstm_cell_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      dgates, dc, dh, dh_more, dc_in, dc_more, act, c, c_new, batch, hidden, accumulate);
  GW_LAUNCH_CHECK();
}

void gru_cell_forward(float* out, float* act, const float* gx, const float* gh, const float* h,
                      const float* b_ih, const float* b_hh, std::int64_t batch, std::int64_t hidden,
                      cudaStream_t stream) {
  const std::int64_t n = batch * hidden;
  if (n == 0) return;
  gru_cell_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, act, gx, gh, h, b_ih, b_hh,
                                                                batch, hidden);
  GW_LAUNCH_CHECK();
}

void gru_cell_backward(float* dgx, float* dgh, float* dh, const float* grad_out, const float* act,
                       const float* h, std::int64_t batch, std::int64_t hidden, bool accumulate,
                       cudaStream_t stream) {
  const std::int64_t n = batch * hidden;
  if (n == 0) return;
  gru_cell_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dgx, dgh, dh, grad_out, act, h,
                                                                 batch, hidden, accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
