#pragma once
// Launch helpers shared by the .cu files of kernels/ (device code only; not a public header).
#include <cstdint>
#include <type_traits>

#include "graphward/base/error.h"

namespace graphward::kernels::detail {

constexpr int kThreads = 256;
// Grid for a grid-stride loop over n elements: enough blocks to fill a large GPU (132 SMs)
// several times over, never more than the elements need.
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
}

// Whether every pointer is 16-byte aligned: where a kernel may read and write them a float4 (or
// uint4) at a time.
template <class... P>
__host__ __device__ __forceinline__ bool all_16_byte_aligned(const P*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) | ...) % 16) == 0;
}

__device__ __forceinline__ void store(float* dst, std::int64_t i, float v, bool accumulate) {
  dst[i] = accumulate ? dst[i] + v : v;
}

// Row kernels that give a row to one warp and hold it in registers (layer norm, softmax): up to
// kWarpRowMaxCols columns, lane l holding columns l, l + 32, ... — kPer of them.
constexpr std::int64_t kWarpRowMaxCols = 1024;  // 32 lanes × 32 registers
// Calls launch(std::integral_constant<int, kPer>) for the narrowest kPer (1, 2, 4, ..., 32) that
// holds `cols` (at most kWarpRowMaxCols). A lane sums its columns in the same order whatever kPer.
template <class Launch>
void by_warp_row_width(std::int64_t cols, Launch launch) {
  if (cols <= 32) {
    launch(std::integral_constant<int, 1>{});
  } else if (cols <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (cols <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else if (cols <= 256) {
    launch(std::integral_constant<int, 8>{});
  } else if (cols <= 512) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, 32>{});
  }
}

}  // namespace graphward::kernels::detail

#define GW_GRID_STRIDE(i, n)                                                                       \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
