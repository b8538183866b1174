#pragma once
// What the fused LSTM cell and layer share (internal to engine/ops/): the checks of their operands
// and of their gradient slots.
#include <array>
#include <cstdint>
#include <span>

#include "graphward/engine/ops/ops.h"

namespace graphward::ops_detail {

struct LstmDims {
  std::int64_t batch, in, hidden;
  bool packed_x;  // x is a state [2, B, in] (a layer's output [2, T·B, in]): its h is read
  bool bias;
  std::int64_t steps = 1;  // T: the time steps of a layer
};

// A cell's operands, or with `layer` a layer's (x of T·B rows), each refused by name (Note
// [Check, then write]).
LstmDims check_lstm(const char* op, const Tensor& x, const Tensor& state, const Tensor& w_ih,
                    const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh, bool layer = false);
// The slots of x, state, W_ih, W_hh and the biases (4 or 6): which gradients are wanted.
std::array<bool, 6> check_lstm_slots(const char* op, std::span<GradSlot> grads, const Tensor& x,
                                     const Tensor& state, const Tensor& w_ih, const Tensor& w_hh);

}  // namespace graphward::ops_detail
