#pragma once
// Recurrent cells, written with the ops of engine/ops/ops.h (their gradients follow from the tape):
// PyTorch's LSTMCell and GRUCell. Each cell is two GEMMs (input and hidden projections of all the
// gates at once) and pointwise ops on windows of them; in a captured step their launch cost is
// gone.
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

}  // namespace graphward
