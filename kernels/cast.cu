// Conversion kernels: one thread per element in a grid-stride loop. Contract in cast.h.
#include <cuda_bf16.h>

#include <algorithm>

#include "graphward/kernels/cast.h"
#include "graphward/kernels/launch.cuh"

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

struct CastBatch {
  CastSlice slice[kCastBatchMax];
};

// Block row blockIdx.y: tensor blockIdx.y, grid-stride over its elements along x.
__global__ void float_to_bf16_batch_kernel(CastBatch batch) {
  const CastSlice s = batch.slice[blockIdx.y];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < s.n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    s.y[i] = to_bits(s.x[i]);
  }
}

}  // namespace

void float_to_bf16_batch(const CastSlice* slices, int count, cudaStream_t stream) {
  if (count <= 0) return;
  GW_CHECK(count <= kCastBatchMax, "float_to_bf16_batch: ", count, " tensors; expected at most ",
           kCastBatchMax, " a launch");
  CastBatch batch{};
  std::int64_t most = 0;
  for (int i = 0; i < count; ++i) {
    batch.slice[i] = slices[i];
    most = most > slices[i].n ? most : slices[i].n;
  }
  // Enough blocks along x for the largest tensor, about two waves in all.
  const std::int64_t wanted = (most + kThreads - 1) / kThreads;
  const std::int64_t cap = std::max<std::int64_t>(1, 2 * 132 * 8 / count);
  const dim3 grid(static_cast<unsigned>(std::max<std::int64_t>(1, std::min(wanted, cap))),
                  static_cast<unsigned>(count));
  float_to_bf16_batch_kernel<<<grid, kThreads, 0, stream>>>(batch);
  GW_LAUNCH_CHECK();
}

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
