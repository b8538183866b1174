#pragma once
// The LSTM cell's pointwise work in one kernel forward and one backward, with CPU references: what
// the fused lstm cell (engine/ops/rnn.h) runs around its GEMMs. Same launcher contract as
// elementwise.h. Layout: gates [B, 4H] in PyTorch's order i, f, g, o; a cell state [2, B, H], its
// hidden state h (the first B · H elements) then its memory c.
//
// Forward, z = gates + b_ih + b_hh (the biases [4H] broadcast over the rows; null: none):
//   i = σ(z_i), f = σ(z_f), g = tanh(z_g), o = σ(z_o);  c' = f · c + i · g;  h' = o · tanh(c').
// `gates` is overwritten with (i, f, g, o), what the backward reads; `out` [2, B, H] gets h', c'.
//
// Backward, with dh', dc' = grad_out [2, B, H], t = tanh(c'), dc* = dc' + dh' · o · (1 − t²):
//   dz_i = dc* · g · i (1 − i),  dz_f = dc* · c · f (1 − f),  dz_g = dc* · i · (1 − g²),
//   dz_o = dh' · t · o (1 − o);   dgates = dz (written),  dc (=|+=) dc* · f (null: not wanted).
#include <cstdint>

#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// float32.
void lstm_cell_forward(float* gates, float* out, const float* c, const float* b_ih,
                       const float* b_hh, std::int64_t batch, std::int64_t hidden,
                       cudaStream_t stream);
void lstm_cell_backward(float* dgates, float* dc, const float* grad_out, const float* act,
                        const float* c, const float* c_new, std::int64_t batch,
                        std::int64_t hidden, bool accumulate, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void lstm_cell_forward(T* gates, T* out, const T* c, const T* b_ih, const T* b_hh,
                       std::int64_t batch, std::int64_t hidden);
template <class T>
void lstm_cell_backward(T* dgates, T* dc, const T* grad_out, const T* act, const T* c,
                        const T* c_new, std::int64_t batch, std::int64_t hidden, bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
