// Softmax kernels: one block of 256 threads per row; the row's maximum and sums reduced in a fixed
// tree (deterministic). Contract in softmax.h.
#include <cmath>

#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/softmax.h"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::grid_for;
using detail::kThreads;
using detail::store;

constexpr int kRowThreads = 256;

// log Σ exp(x_j) of one row, in every thread of the block.
__device__ float row_lse(const float* x, std::int64_t cols) {
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) m = fmaxf(m, x[j]);
  m = block_reduce<kRowThreads>(m, detail::MaxOp{});
  float s = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) s += expf(x[j] - m);
  s = block_reduce<kRowThreads>(s);
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
  s = block_reduce<kRowThreads>(s);
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
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kMeanThreads) {
    const std::int32_t t = target[i];
    acc += (t >= 0 && t < cols) ? static_cast<double>(lse[i]) - static_cast<double>(x[i * cols + t])
                                : static_cast<double>(NAN);
  }
  acc = block_reduce<kMeanThreads>(acc);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(acc / static_cast<double>(rows));
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
