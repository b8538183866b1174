// The LSTM and GRU cells' pointwise kernels: one thread per (row, unit) in a grid-stride loop, the
// gates of a unit read and written by that thread (rnn_unit.h). Contract in rnn.h.
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/rnn.h"
#include "graphward/kernels/rnn_unit.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;

__global__ void lstm_cell_forward_kernel(float* gates, float* h_out, float* c_out, const float* c,
                                         const float* b_ih, const float* b_hh, std::int64_t batch,
                                         std::int64_t hidden) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    c_out[e] = detail::lstm_unit_forward(gates + r * 4 * hidden + j, hidden, b_ih, b_hh, j, c[e],
                                         h_out + e);
  }
}

__global__ void lstm_cell_backward_kernel(float* dgates, float* dc, const float* dh,
                                          const float* dh_more, const float* dc_in,
                                          const float* dc_more, const float* act, const float* c,
                                          const float* c_new, std::int64_t batch,
                                          std::int64_t hidden, bool accumulate) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const float d =
        detail::lstm_unit_backward(dgates + r * 4 * hidden + j, act + r * 4 * hidden + j, hidden,
                                   dh[e] + (dh_more ? dh_more[e] : 0.f),
                                   dc_in[e] + (dc_more ? dc_more[e] : 0.f), c[e], c_new[e]);
    if (dc) detail::store(dc, e, d, accumulate);
  }
}

__global__ void gru_cell_forward_kernel(float* out, float* act, const float* gx, const float* gh,
                                        const float* h, const float* b_ih, const float* b_hh,
                                        std::int64_t batch, std::int64_t hidden) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    out[e] = detail::gru_unit_forward(act + r * 4 * hidden + j, gx + r * 3 * hidden + j,
                                      gh + r * 3 * hidden + j, hidden, b_ih, b_hh, j, h[e]);
  }
}

__global__ void gru_cell_backward_kernel(float* dgx, float* dgh, float* dh, const float* grad_out,
                                         const float* act, const float* h, std::int64_t batch,
                                         std::int64_t hidden, bool accumulate) {
  GW_GRID_STRIDE(e, batch * hidden) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const float d = detail::gru_unit_backward(dgx + r * 3 * hidden + j, dgh + r * 3 * hidden + j,
                                              act + r * 4 * hidden + j, hidden, grad_out[e], h[e]);
    if (dh) detail::store(dh, e, d, accumulate);
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
