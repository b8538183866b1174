// Conversion kernels: one thread per element in a grid-stride loop. Contract in cast.h.
#include <cuda_bf16.h>

#include "kernels/cast.h"
#include "kernels/launch.cuh"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;

__device__ __forceinline__ float to_float(std::uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ __forceinline__ std::uint16_t to_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__global__ void float_to_bf16_kernel(std::uint16_t* y, const float* x, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    y[i] = to_bits(accumulate ? to_float(y[i]) + x[i] : x[i]);
  }
}

__global__ void bf16_to_float_kernel(float* y, const std::uint16_t* x, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    y[i] = accumulate ? y[i] + to_float(x[i]) : to_float(x[i]);
  }
}

}  // namespace

void float_to_bf16(std::uint16_t* y, const float* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream) {
  float_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n, accumulate);
  GW_LAUNCH_CHECK();
}

void bf16_to_float(float* y, const std::uint16_t* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream) {
  bf16_to_float_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n, accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
