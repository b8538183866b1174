#pragma once
// Recurrent cells. lstm_cell and gru_cell are written with the ops of engine/ops/ops.h (their
// gradients follow from the tape): PyTorch's LSTMCell and GRUCell, each two GEMMs (input and
// hidden projections of all the gates at once) and pointwise ops on windows of them.
// fused_lstm_cell and fused_gru_cell are the same cells as one op each: their two GEMMs and their
// pointwise work in one kernel, forward and backward (kernels/rnn.h) — three kernels a cell
// forward where the composed cells run sixteen ops (LSTM) and nineteen (GRU).
#include <span>

#include "graphward/engine/ops/ops.h"

namespace graphward {

struct LstmState {
  Tensor h, c;  // [B, H] each
};

// gates = x·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh ([B, 4H], in the order i, f, g, o);
// c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c'). W_ih [4H, in], W_hh [4H, H], biases [4H].
inline LstmState lstm_cell(const Tensor& x, const LstmState& s, const Tensor& w_ih,
                           const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  // The state's batch is x's: an h or c of another batch would broadcast in the sums.
  GW_CHECK(x.defined() && s.h.defined() && s.c.defined() && x.dim() == 2 && s.h.dim() == 2 &&
               s.h.size(0) == x.size(0) && s.c.shape() == s.h.shape(),
           "lstm_cell: x is ", x.defined() ? x.str() : "undefined", ", h ",
           s.h.defined() ? s.h.str() : "undefined", ", c ", s.c.defined() ? s.c.str() : "undefined",
           "; expected x [B, in] and h, c [B, H] of the same batch B");
  const std::int64_t hidden = s.h.size(-1);
  GW_CHECK(w_ih.dim() == 2 && w_ih.size(0) == 4 * hidden, "lstm_cell: W_ih is ",
           shape_str(w_ih.shape()), "; expected [4·H, in] with H = ", hidden,
           " (h's last dimension)");
  const Tensor gates = add(linear(x, w_ih, b_ih), linear(s.h, w_hh, b_hh));
  const Tensor i = sigmoid(narrow(gates, 0, hidden));
  const Tensor f = sigmoid(narrow(gates, hidden, hidden));
  const Tensor g = tanh(narrow(gates, 2 * hidden, hidden));
  const Tensor o = sigmoid(narrow(gates, 3 * hidden, hidden));
  const Tensor c = add(mul(f, s.c), mul(i, g));
  return {mul(o, tanh(c)), c};
}

// r = σ(W_ir·x + b_ir + W_hr·h + b_hr), z = σ(W_iz·x + b_iz + W_hz·h + b_hz),
// n = tanh(W_in·x + b_in + r·(W_hn·h + b_hn)), h' = (1 − z)·n + z·h.
// W_ih [3H, in], W_hh [3H, H], biases [3H] (the order r, z, n).
inline Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih, const Tensor& b_hh) {
  // The state's batch is x's: an h of another batch would broadcast in the sums.
  GW_CHECK(x.defined() && h.defined() && x.dim() == 2 && h.dim() == 2 && h.size(0) == x.size(0),
           "gru_cell: x is ", x.defined() ? x.str() : "undefined", ", h ",
           h.defined() ? h.str() : "undefined",
           "; expected x [B, in] and h [B, H] of the same "
           "batch B");
  const std::int64_t hidden = h.size(-1);
  GW_CHECK(w_ih.dim() == 2 && w_ih.size(0) == 3 * hidden, "gru_cell: W_ih is ",
           shape_str(w_ih.shape()), "; expected [3·H, in] with H = ", hidden,
           " (h's last dimension)");
  const Tensor gx = linear(x, w_ih, b_ih), gh = linear(h, w_hh, b_hh);
  const Tensor r = sigmoid(add(narrow(gx, 0, hidden), narrow(gh, 0, hidden)));
  const Tensor z = sigmoid(add(narrow(gx, hidden, hidden), narrow(gh, hidden, hidden)));
  const Tensor n =
      tanh(add(narrow(gx, 2 * hidden, hidden), mul(r, narrow(gh, 2 * hidden, hidden))));
  return add(sub(n, mul(z, n)), mul(z, h));  // (1 − z)·n + z·h
}

// A fused LSTM cell's state: h then c in one tensor [2, B, H] (one output a cell, as the tape
// records an op). lstm_state packs an h and a c ([B, H] each, differentiable); lstm_hidden gives
// a state's h as a [B, H] tensor (a copy; its gradient goes back to the state's first half).
Tensor lstm_state(const Tensor& h, const Tensor& c);
Tensor lstm_hidden(const Tensor& state);

// The LSTM cell of lstm_cell above, as one op: gates = x·W_ihᵀ + h·W_hhᵀ (two GEMMs into one
// matrix), then c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c') with both biases in one kernel.
// x: [B, in], or the state of the layer below [2, B, in] (its h is read, in place: a stacked LSTM
// needs no copy between layers); state: [2, B, H]; W_ih [4H, in], W_hh [4H, H], biases [4H] —
// both, or neither (undefined). Returns the new state [2, B, H]. float32 (and float64 on the CPU).
// Its backward: the pointwise gradient in one kernel, then the GEMMs of the input's, the state's
// and the weights' gradients and the biases' column sums.
Tensor fused_lstm_cell(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih, const Tensor& b_hh);
// grads: x, state, W_ih, W_hh, then b_ih, b_hh where the biases are defined. act: the gate
// activations (i, f, g, o) [B, 4H] the forward saved; out: the forward's output.
void fused_lstm_cell_backward(const Tensor& grad_out, const Tensor& x, const Tensor& state,
                              const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                              const Tensor& out, std::span<GradSlot> grads);

// A whole LSTM layer over T time steps as one op, as cuDNN runs one: the input projections of all
// the steps in one GEMM, then per step one GEMM (h·W_hhᵀ added in place) and the cell's pointwise
// kernel; its backward per step the pointwise gradient and one GEMM (the gradient reaching h), then
// the input's and the weights' gradients of all the steps in one GEMM each.
// xs: [T·B, in], step t in rows [t·B, (t + 1)·B) — or a layer's output [2, T·B, in] (its h's are
// read in place); state: the initial h and c [2, B, H]; weights and biases as fused_lstm_cell's.
// Returns [2, T·B, H]: h_1 … h_T, then c_1 … c_T (a next layer's input as it stands;
// lstm_hidden(out) gives every step's h, and the last B rows of each half are the final state).
// float32 (and float64 on the CPU).
Tensor fused_lstm_layer(const Tensor& xs, const Tensor& state, const Tensor& w_ih,
                        const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh);
// grads as fused_lstm_cell_backward's; act: the gate activations [T·B, 4H] the forward saved.
void fused_lstm_layer_backward(const Tensor& grad_out, const Tensor& xs, const Tensor& state,
                               const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                               const Tensor& out, std::span<GradSlot> grads);

// The GRU cell of gru_cell above, as one op: gx = x·W_ihᵀ and gh = h·W_hhᵀ (two GEMMs), then the
// gates with the biases in one kernel. x [B, in], h [B, H], W_ih [3H, in], W_hh [3H, H], biases
// [3H] — both, or neither. Returns h' [B, H]. float32 (and float64 on the CPU).
Tensor fused_gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                      const Tensor& b_ih, const Tensor& b_hh);
// grads: x, h, W_ih, W_hh, then b_ih, b_hh where the biases are defined. act: r, z, n and
// W_hn·h + b_hn [B, 4H], saved by the forward.
void fused_gru_cell_backward(const Tensor& grad_out, const Tensor& x, const Tensor& h,
                             const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                             std::span<GradSlot> grads);

}  // namespace graphward
