#pragma once
// The LSTM and GRU cells' pointwise work in one kernel forward and one backward each, with CPU
// references: what the fused cells (engine/ops/rnn.h) run around their GEMMs. Same launcher
// contract as elementwise.h. Layout: gates [B, 4H] in PyTorch's order i, f, g, o; h and c [B, H].
//
// LSTM forward, z = gates + b_ih + b_hh (the biases [4H] broadcast over the rows; null: none):
//   i = σ(z_i), f = σ(z_f), g = tanh(z_g), o = σ(z_o);  c' = f · c + i · g;  h' = o · tanh(c').
// `gates` is overwritten with (i, f, g, o), what the backward reads; h' and c' are stored.
//
// LSTM backward, with dh' = dh + dh_more and dc' = dc_in + dc_more (a null `more`: 0; the
// gradients reaching h' and c'), t = tanh(c'), dc* = dc' + dh' · o · (1 − t²):
//   dz_i = dc* · g · i (1 − i),  dz_f = dc* · c · f (1 − f),  dz_g = dc* · i · (1 − g²),
//   dz_o = dh' · t · o (1 − o);   dgates = dz (written),  dc (=|+=) dc* · f (null: not wanted;
//   it may be dc_more itself: each element is read before it is written).
//
// GRU: gx = x·W_ihᵀ and gh = h·W_hhᵀ [B, 3H] in PyTorch's order r, z, n, without their biases:
//   r = σ(gx_r + b_ir + gh_r + b_hr),  z = σ(gx_z + b_iz + gh_z + b_hz),  hn = gh_n + b_hn,
//   n = tanh(gx_n + b_in + r · hn),  h' = (1 − z) · n + z · h.
// act [B, 4H] gets r, z, n, hn (what the backward reads). Backward, with dh' = grad_out:
//   dz = dh' · (h − n) · z (1 − z),  dn = dh' · (1 − z) · (1 − n²),  dr = dn · hn · r (1 − r);
//   dgx = (dr, dz, dn), dgh = (dr, dz, dn · r) (written); dh (=|+=) dh' · z (null: not wanted) —
//   the part of h's gradient that is not dgh·W_hh.
#include <cstdint>

#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// float32.
void lstm_cell_forward(float* gates, float* h_out, float* c_out, const float* c, const float* b_ih,
                       const float* b_hh, std::int64_t batch, std::int64_t hidden,
                       cudaStream_t stream);
void lstm_cell_backward(float* dgates, float* dc, const float* dh, const float* dh_more,
                        const float* dc_in, const float* dc_more, const float* act, const float* c,
                        const float* c_new, std::int64_t batch, std::int64_t hidden,
                        bool accumulate, cudaStream_t stream);
void gru_cell_forward(float* out, float* act, const float* gx, const float* gh, const float* h,
                      const float* b_ih, const float* b_hh, std::int64_t batch, std::int64_t hidden,
                      cudaStream_t stream);
void gru_cell_backward(float* dgx, float* dgh, float* dh, const float* grad_out, const float* act,
                       const float* h, std::int64_t batch, std::int64_t hidden, bool accumulate,
                       cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void lstm_cell_forward(T* gates, T* h_out, T* c_out, const T* c, const T* b_ih, const T* b_hh,
                       std::int64_t batch, std::int64_t hidden);
template <class T>
void lstm_cell_backward(T* dgates, T* dc, const T* dh, const T* dh_more, const T* dc_in,
                        const T* dc_more, const T* act, const T* c, const T* c_new,
                        std::int64_t batch, std::int64_t hidden, bool accumulate);
template <class T>
void gru_cell_forward(T* out, T* act, const T* gx, const T* gh, const T* h, const T* b_ih,
                      const T* b_hh, std::int64_t batch, std::int64_t hidden);
template <class T>
void gru_cell_backward(T* dgx, T* dgh, T* dh, const T* grad_out, const T* act, const T* h,
                       std::int64_t batch, std::int64_t hidden, bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
