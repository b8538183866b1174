// Dropout kernels. Contract in dropout.h.
#include "graphward/kernels/dropout.h"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/philox.h"
#include "graphward/kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;
using detail::load;
using detail::put;

__device__ std::uint64_t word64(const std::int32_t* s) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[0])) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[1])) << 32);
}

template <class S>
__global__ void dropout_kernel(S* y, float* mask, const S* x, const std::int32_t* state,
                               std::int64_t n, float p, float scale) {
  const std::uint64_t seed = word64(state), offset = word64(state + 2);
  GW_GRID_STRIDE(i, n) {
    const float m = dropout_keep(seed, offset, static_cast<std::uint64_t>(i), p) ? scale : 0.f;
    mask[i] = m;
    put(y, i, load(x, i) * m);
  }
}

__global__ void dropout_backward_kernel(bf16* dx, const bf16* dy, const float* mask,
                                        std::int64_t n, bool accumulate) {
  GW_GRID_STRIDE(i, n) put(dx, i, load(dy, i) * mask[i], accumulate);
}

__global__ void advance_kernel(std::int32_t* state, std::int64_t n) {
  const std::uint64_t offset = word64(state + 2) + static_cast<std::uint64_t>(n);
  state[2] = static_cast<std::int32_t>(static_cast<std::uint32_t>(offset));
  state[3] = static_cast<std::int32_t>(static_cast<std::uint32_t>(offset >> 32));
}

}  // namespace

void advance_offset(std::int32_t* state, std::int64_t n, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(state, n);
  GW_LAUNCH_CHECK();
}

template <class S>
void dropout_forward(S* y, float* mask, const S* x, std::int32_t* state, std::int64_t n, float p,
                     cudaStream_t stream) {
  dropout_kernel<S>
      <<<grid_for(n), kThreads, 0, stream>>>(y, mask, x, state, n, p, 1.f / (1.f - p));
  GW_LAUNCH_CHECK();
  advance_offset(state, n, stream);
}

template void dropout_forward<float>(float*, float*, const float*, std::int32_t*, std::int64_t,
                                     float, cudaStream_t);
template void dropout_forward<bf16>(bf16*, float*, const bf16*, std::int32_t*, std::int64_t, float,
                                    cudaStream_t);

void dropout_backward(bf16* dx, const bf16* dy, const float* mask, std::int64_t n, bool accumulate,
                      cudaStream_t stream) {
  dropout_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, mask, n, accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
