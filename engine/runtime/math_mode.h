#pragma once
// Note [TF32]
// Hopper's tensor cores multiply float32 matrices as TF32 (a 10-bit mantissa, float32's 8-bit
// exponent; the products accumulated in float32) at several times the speed of float32 FMA. Two
// process-wide switches, read by every op when it launches, say whether graphward may:
//   * matmul — float32 GEMMs (linear, matmul, bmm and their gradients; cuBLASLt compute type
//     CUBLAS_COMPUTE_32F_FAST_TF32, and cuBLAS's own GEMMs where they run instead);
//   * conv — float32 convolutions (conv2d and its gradients; cuDNN's tensor-op math type).
// Both are off unless set: float32 means float32 (PyTorch's default for matmul; its cuDNN
// convolutions default to TF32, which graphward does not: set both to compare like for like).
// bfloat16 GEMMs are untouched (their arithmetic is float32 either way). A result computed with
// TF32 differs from the float32 one by about 1e-3 relative, as the 10-bit mantissa gives.
//
// Switch between steps, not during one. A captured step never replays across a switch: a
// BackwardGraph's tape signature holds the switches (a change is a structure mismatch, captured
// anew), and a StepGraph notes them at its capture (Note [Host state of a captured step]).
// GEMM and convolution plans are kept per switch setting, so switching back reuses the first.
#include <cstdint>

namespace graphward {

void set_matmul_tf32(bool on);
bool matmul_tf32() noexcept;
void set_conv_tf32(bool on);
bool conv_tf32() noexcept;

namespace detail {
// The switches as one word (bit 0: matmul, bit 1: conv), for the signatures of captured steps.
std::uint64_t math_mode_word() noexcept;
// "TF32 for matmul on, for conv off".
const char* math_mode_str(std::uint64_t word) noexcept;
}  // namespace detail

}  // namespace graphward
