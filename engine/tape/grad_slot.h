#pragma once
// Where a backward writes an input's gradient (GradSlot; the contract: engine/ops/ops.h, "Backward"),
// and what the backward executor hands a linear layer's input gradient under Note [Backward
// epilogue fusion] (engine/ops/ops.h). Apart from the ops so that the tape (engine/tape/autograd.h) can
// name them without the ops.
#include <cstdint>

#include "graphward/engine/runtime/tensor.h"

namespace graphward {

// A linear layer's fused activation (linear(x, weight, bias, act), engine/ops/ops.h).
enum class Activation : std::uint8_t { kNone, kRelu, kGelu };
// Whether `a` is one of Activation's names (an enum can hold any value of its type).
constexpr bool is_valid(Activation a) {
  return static_cast<std::uint8_t>(a) <= static_cast<std::uint8_t>(Activation::kGelu);
}

// Note [Backward epilogue fusion]: the activation of the layer P whose output is this layer's
// input, applied to the input gradient (a linear layer's: in the GEMM's epilogue; a pooling's: in
// its backward kernel).
struct GradEpilogue {
  Activation act = Activation::kNone;
  Tensor act_input;  // ReLU: P's output; GELU: its pre-activation (both P's output's shape)
  Tensor relu_mask;  // ReLU of a linear layer on CUDA: the bit mask of P's forward, if written
};

struct GradSlot {
  Tensor* tensor = nullptr;
  bool accumulate = false;
  bool may_share = false;
  // Note [Backward epilogue fusion]: set by the backward executor on the input gradient of a
  // linear layer (linear_backward's grad_x) whose input is the output of a linear+activation
  // layer, or of a pooling whose input is a conv2d_relu's output: what to write into the slot is
  // then that layer's pre-activation gradient.
  const GradEpilogue* epilogue = nullptr;
};

}  // namespace graphward
