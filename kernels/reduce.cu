// Reduction kernels. Contract in reduce.h.
//
// Full reductions run in one block of 1024 threads: each thread sums a strided slice in double,
// then the block reduces in shared memory in a fixed tree. One launch, no workspace, no atomics,
// deterministic. (A multi-block version needs a workspace; it pays only for vectors far larger than
// a loss, and can come with a measurement that asks for it.)
#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.h"
#include "kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::grid_for;
using detail::kThreads;
using detail::load;
using detail::put;
using detail::store;

constexpr int kReduceThreads = 1024;

__global__ void sum_forward_kernel(float* out, const float* x, float scale, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc * scale);
}

__global__ void sum_backward_kernel(float* dx, const float* dy, float scale, std::int64_t n,
                                    bool accumulate) {
  const float g = scale * dy[0];
  GW_GRID_STRIDE(i, n) {
    store(dx, i, g, accumulate);
  }
}

// Block (32, Y): threadIdx.x picks a column, threadIdx.y a slice of rows (rows y, y + Y, ...); a
// fixed shared-memory tree combines the Y slices. Reads are coalesced along the row. Y = 32 from
// 256 rows on: the tall shapes of bias gradients (hundreds of rows or more, tens of columns, so a
// few blocks) then have short chains a thread; below, Y = 8, where more slices only add to the
// tree (docs/RESULTS.md has the figures).
constexpr int kColumnSlices = 32;  // the largest Y

template <class T>
__global__ void column_sum_kernel(T* dst, const T* src, const T* other, float alpha,
                                  std::int64_t rows, std::int64_t cols, bool accumulate) {
  __shared__ double partial[kColumnSlices][33];
  const int slices = static_cast<int>(blockDim.y);
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double acc = 0;
  if (col < cols) {
#pragma unroll 4
    for (std::int64_t r = threadIdx.y; r < rows; r += slices) {
      const std::int64_t i = r * cols + col;
      acc += other ? double(load(src, i)) * double(load(other, i)) : double(load(src, i));
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  for (int half = slices / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < cols) {
    put(dst, col, static_cast<float>(alpha * partial[0][threadIdx.x]), accumulate);
  }
}

__global__ void mse_loss_forward_kernel(float* out, const float* pred, const float* target,
                                        std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double d = double(pred[i]) - double(target[i]);
    acc += d * d;
  }
  acc = block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / double(n));
}

__global__ void mse_loss_backward_kernel(float* dpred, float* dtarget, const float* dy,
                                         const float* pred, const float* target, std::int64_t n,
                                         bool accumulate_pred, bool accumulate_target) {
  const float scale = 2.f * dy[0] / static_cast<float>(n);
  GW_GRID_STRIDE(i, n) {
    const float g = scale * (pred[i] - target[i]);
    if (dpred) store(dpred, i, g, accumulate_pred);
    if (dtarget) store(dtarget, i, -g, accumulate_target);
  }
}

}  // namespace

void sum_forward(float* out, const float* x, float scale, std::int64_t n, cudaStream_t stream) {
  sum_forward_kernel<<<1, kReduceThreads, 0, stream>>>(out, x, scale, n);
  GW_LAUNCH_CHECK();
}
void sum_backward(float* dx, const float* dy, float scale, std::int64_t n, bool accumulate,
                  cudaStream_t stream) {
  sum_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, scale, n, accumulate);
  GW_LAUNCH_CHECK();
}
template <class T>
void column_sum(T* dst, const T* src, const T* other, float alpha, std::int64_t rows,
                std::int64_t cols, bool accumulate, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  const unsigned slices = rows >= 256 ? kColumnSlices : 8;
  column_sum_kernel<<<blocks, dim3(32, slices), 0, stream>>>(dst, src, other, alpha, rows, cols,
                                                             accumulate);
  GW_LAUNCH_CHECK();
}
template void column_sum<float>(float*, const float*, const float*, float, std::int64_t,
                                std::int64_t, bool, cudaStream_t);
template void column_sum<bf16>(bf16*, const bf16*, const bf16*, float, std::int64_t,
                               std::int64_t, bool, cudaStream_t);
void mse_loss_forward(float* out, const float* pred, const float* target, std::int64_t n,
                      cudaStream_t stream) {
  mse_loss_forward_kernel<<<1, kReduceThreads, 0, stream>>>(out, pred, target, n);
  GW_LAUNCH_CHECK();
}
void mse_loss_backward(float* dpred, float* dtarget, const float* dy, const float* pred,
                       const float* target, std::int64_t n, bool accumulate_pred,
                       bool accumulate_target, cudaStream_t stream) {
  mse_loss_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      dpred, dtarget, dy, pred, target, n, accumulate_pred, accumulate_target);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
