#pragma once
// Conversions between element types (engine's cast op). Contract of elementwise.h: outputs first,
// never allocate, never synchronize; `accumulate` adds (in float32, then rounds) instead of
// writing. bfloat16 values are their 16 bits (uint16_t), rounded to nearest, ties to even —
// bitwise the same on the CPU (base/dtype.h bf16::from_float) and on CUDA (__float2bfloat16_rn).
#include <cstdint>
#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
void float_to_bf16(std::uint16_t* y, const float* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream);
void bf16_to_float(float* y, const std::uint16_t* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream);

// Several float_to_bf16 (no accumulation) in one launch: y_i = x_i rounded, for up to
// kCastBatchMax tensors (a block row per tensor).
struct CastSlice {
  std::uint16_t* y;
  const float* x;
  std::int64_t n;
};
inline constexpr int kCastBatchMax = 48;
void float_to_bf16_batch(const CastSlice* slices, int count, cudaStream_t stream);
#endif

}  // namespace graphward::kernels
