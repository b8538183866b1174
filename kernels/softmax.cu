// Softmax kernels: one block of 256 threads per row; the row's maximum and sums reduced in a fixed
// tree (deterministic). Contract in softmax.h.
#include <cmath>

#include "kernels/launch.cuh"
#include "kernels/softmax.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;
using detail::store;

constexpr int kRowThreads = 256;

template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[kRowThreads / 32];
  __shared__ float result;
  for (int offset = 16; offset > 0; offset /= 2) {
    const float o = __shfl_down_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kRowThreads / 32 ? partial[lane] : (kMax ? -INFINITY : 0.f);
    for (int offset = 16; offset > 0; offset /= 2) {
      const float o = __shfl_down_sync(0xffffffffu, v, offset);
      v = kMax ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) result = v;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // `result` and `partial` may be reused by the next reduction
  return r;
}

// log Σ exp(x_j) of one row, in every thread of the block.
__device__ float row_lse(const float* x, std::int64_t cols) {
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) m = fmaxf(m, x[j]);
  m = block_reduce<true>(m);
  float s = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) s += expf(x[j] - m);
  s = block_reduce<false>(s);
  return m + logf(s);
}

template <bool kLog>
__global__ void softmax_forward_kernel(float* y, const float* x, std::int64_t cols) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  const float lse = row_lse(xr, cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float v = xr[j] - lse;
    yr[j] = kLog ? v : expf(v);
  }
}

template <bool kLog>
__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y,
                                        std::int64_t cols, bool accumulate) {
  const std::int64_t row = blockIdx.x;
  const float* dyr = dy + row * cols;
  const float* yr = y + row * cols;
  float s = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    s += kLog ? dyr[j] : dyr[j] * yr[j];
  }
  s = block_reduce<false>(s);
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float g = kLog ? dyr[j] - expf(yr[j]) * s : yr[j] * (dyr[j] - s);
    store(dx, row * cols + j, g, accumulate);
  }
}

__global__ void row_lse_kernel(float* lse, const float* x, std::int64_t cols) {
  const std::int64_t row = blockIdx.x;
  const float v = row_lse(x + row * cols, cols);
  if (threadIdx.x == 0) lse[row] = v;
}

constexpr int kMeanThreads = 1024;

__global__ void cross_entropy_mean_kernel(float* loss, const float* lse, const float* x,
                                          const std::int32_t* target, std::int64_t rows,
                                          std::int64_t cols) {
  __shared__ double partial[kMeanThreads / 32];
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kMeanThreads) {
    const std::int32_t t = target[i];
    acc += (t >= 0 && t < cols) ? static_cast<double>(lse[i]) - static_cast<double>(x[i * cols + t])
                                : static_cast<double>(NAN);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kMeanThreads / 32 ? partial[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0) loss[0] = static_cast<float>(acc / static_cast<double>(rows));
  }
}

__global__ void cross_entropy_backward_kernel(float* dx, const float* dloss, const float* x,
                                              const float* lse, const std::int32_t* target,
                                              std::int64_t rows, std::int64_t cols,
                                              bool accumulate) {
  const float scale = dloss[0] / static_cast<float>(rows);
  GW_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols, j = i % cols;
    const float p = expf(x[i] - lse[r]);
    store(dx, i, (p - (j == target[r] ? 1.f : 0.f)) * scale, accumulate);
  }
}

}  // namespace

void softmax_forward(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream) {
  softmax_forward_kernel<false><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(y, x, cols);
  GW_LAUNCH_CHECK();
}
void log_softmax_forward(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                         cudaStream_t stream) {
  softmax_forward_kernel<true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(y, x, cols);
  GW_LAUNCH_CHECK();
}
void softmax_backward(float* dx, const float* dy, const float* y, std::int64_t rows,
                      std::int64_t cols, bool accumulate, cudaStream_t stream) {
  softmax_backward_kernel<false>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(dx, dy, y, cols, accumulate);
  GW_LAUNCH_CHECK();
}
void log_softmax_backward(float* dx, const float* dy, const float* y, std::int64_t rows,
                          std::int64_t cols, bool accumulate, cudaStream_t stream) {
  softmax_backward_kernel<true>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(dx, dy, y, cols, accumulate);
  GW_LAUNCH_CHECK();
}
void cross_entropy_forward(float* loss, float* lse, const float* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  row_lse_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(lse, x, cols);
  GW_LAUNCH_CHECK();
  cross_entropy_mean_kernel<<<1, kMeanThreads, 0, stream>>>(loss, lse, x, target, rows, cols);
  GW_LAUNCH_CHECK();
}
void cross_entropy_backward(float* dx, const float* dloss, const float* x, const float* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            bool accumulate, cudaStream_t stream) {
  cross_entropy_backward_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(
      dx, dloss, x, lse, target, rows, cols, accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
