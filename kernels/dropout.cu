// Dropout kernels. Contract in dropout.h.
#include "kernels/dropout.h"
#include "kernels/launch.cuh"
#include "kernels/philox.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;

__device__ std::uint64_t word64(const std::int32_t* s) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[0])) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[1])) << 32);
}

__global__ void dropout_kernel(float* y, float* mask, const float* x, const std::int32_t* state,
                               std::int64_t n, float p, float scale) {
  const std::uint64_t seed = word64(state), offset = word64(state + 2);
  GW_GRID_STRIDE(i, n) {
    const float m = dropout_keep(seed, offset, static_cast<std::uint64_t>(i), p) ? scale : 0.f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void advance_kernel(std::int32_t* state, std::int64_t n) {
  const std::uint64_t offset = word64(state + 2) + static_cast<std::uint64_t>(n);
  state[2] = static_cast<std::int32_t>(static_cast<std::uint32_t>(offset));
  state[3] = static_cast<std::int32_t>(static_cast<std::uint32_t>(offset >> 32));
}

}  // namespace

void dropout_forward(float* y, float* mask, const float* x, std::int32_t* state, std::int64_t n,
                     float p, cudaStream_t stream) {
  dropout_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, mask, x, state, n, p, 1.f / (1.f - p));
  GW_LAUNCH_CHECK();
  advance_kernel<<<1, 1, 0, stream>>>(state, n);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
