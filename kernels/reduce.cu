// Reduction kernels. Contract in reduce.h.
//
// Full reductions run in one block of 1024 threads: each thread sums a strided slice in double,
// then the block reduces in shared memory in a fixed tree. One launch, no workspace, no atomics,
// deterministic. (A multi-block version needs a workspace; it pays only for vectors far larger than
// a loss, and can come with a measurement that asks for it.)
#include "graphward/kernels/block_reduce.cuh"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/reduce.h"
#include "graphward/kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::grid_for;
using detail::kThreads;
using detail::load;
using detail::put;

constexpr int kReduceThreads = 1024;

template <class S>
__global__ void sum_forward_kernel(float* out, const S* x, float scale, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += load(x, i);
  acc = block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc * scale);
}

template <class S>
__global__ void sum_backward_kernel(S* dx, const float* dy, float scale, std::int64_t n,
                                    bool accumulate) {
  const float g = scale * dy[0];
  GW_GRID_STRIDE(i, n) {
    put(dx, i, g, accumulate);
  }
}

// Block (32, Y), a block summing W columns (W = 8, 16 or 32). A warp reads 32 / W rows of W
// consecutive columns at once (lane x: column x % W, row x / W), so each read is whole 32-byte
// sectors; thread (x, y) sums rows x / W + (32 / W)·(y + Y·i), i = 0, 1, ... Then a fixed
// shared-memory tree combines the Y slices, and lane c < W adds the 32 / W rows of its column in
// order. Narrow W spreads a bias gradient's few columns over more blocks, and Y = 32 from 256 rows
// on gives each thread of a tall one a short chain (docs/RESULTS.md has the figures). Fixed shapes
// give a fixed order: deterministic.
constexpr int kColumnSlices = 32;  // the largest Y

template <class D, class T>
__global__ void column_sum_kernel(D* dst, const T* src, const T* other, float alpha,
                                  std::int64_t rows, std::int64_t cols, int width,
                                  bool accumulate) {
  __shared__ double partial[kColumnSlices][33];
  const int slices = static_cast<int>(blockDim.y);
  const int lanes_per_row = width, rows_per_warp = 32 / width;
  const int lane = static_cast<int>(threadIdx.x);
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * width + lane % lanes_per_row;
  double acc = 0;
  if (col < cols) {
    const std::int64_t step = static_cast<std::int64_t>(rows_per_warp) * slices;
#pragma unroll 4
    for (std::int64_t r =
             lane / lanes_per_row + rows_per_warp * static_cast<std::int64_t>(threadIdx.y);
         r < rows; r += step) {
      const std::int64_t i = r * cols + col;
      acc += other ? double(load(src, i)) * double(load(other, i)) : double(load(src, i));
    }
  }
  partial[threadIdx.y][lane] = acc;
  __syncthreads();
  for (int half = slices / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      partial[threadIdx.y][lane] += partial[threadIdx.y + half][lane];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && lane < width && col < cols) {
    double total = 0;
    for (int k = 0; k < rows_per_warp; ++k) total += partial[0][lane + k * width];
    put(dst, col, static_cast<float>(alpha * total), accumulate);
  }
}

template <class S>
__global__ void mse_loss_forward_kernel(float* out, const S* pred, const S* target,
                                        std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double d = double(load(pred, i)) - double(load(target, i));
    acc += d * d;
  }
  acc = block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / double(n));
}

template <class S>
__global__ void mse_loss_backward_kernel(S* dpred, S* dtarget, const float* dy, const S* pred,
                                         const S* target, std::int64_t n, bool accumulate_pred,
                                         bool accumulate_target) {
  const float scale = 2.f * dy[0] / static_cast<float>(n);
  GW_GRID_STRIDE(i, n) {
    const float g = scale * (load(pred, i) - load(target, i));
    if (dpred) put(dpred, i, g, accumulate_pred);
    if (dtarget) put(dtarget, i, -g, accumulate_target);
  }
}

}  // namespace

template <class S>
void sum_forward(float* out, const S* x, float scale, std::int64_t n, cudaStream_t stream) {
  sum_forward_kernel<S><<<1, kReduceThreads, 0, stream>>>(out, x, scale, n);
  GW_LAUNCH_CHECK();
}
template <class S>
void sum_backward(S* dx, const float* dy, float scale, std::int64_t n, bool accumulate,
                  cudaStream_t stream) {
  sum_backward_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(dx, dy, scale, n, accumulate);
  GW_LAUNCH_CHECK();
}
namespace {
template <class D, class T>
void launch_column_sum(D* dst, const T* src, const T* other, float alpha, std::int64_t rows,
                       std::int64_t cols, bool accumulate, cudaStream_t stream) {
  // Columns a block: for 256 rows or more, 32 where that still makes 16 blocks, narrower
  // otherwise; below 256 rows, 32 (a short matrix: more blocks only add to the launch).
  const int width = rows < 256 || cols >= 16 * 32 ? 32 : cols >= 16 * 16 ? 16 : 8;
  const unsigned blocks = static_cast<unsigned>((cols + width - 1) / width);
  const unsigned slices = rows >= 256 ? kColumnSlices : 8;
  column_sum_kernel<<<blocks, dim3(32, slices), 0, stream>>>(dst, src, other, alpha, rows, cols,
                                                             width, accumulate);
  GW_LAUNCH_CHECK();
}
}  // namespace
template <class T>
void column_sum(T* dst, const T* src, const T* other, float alpha, std::int64_t rows,
                std::int64_t cols, bool accumulate, cudaStream_t stream) {
  launch_column_sum(dst, src, other, alpha, rows, cols, accumulate, stream);
}
void column_sum(float* dst, const bf16* src, float alpha, std::int64_t rows, std::int64_t cols,
                bool accumulate, cudaStream_t stream) {
  launch_column_sum(dst, src, static_cast<const bf16*>(nullptr), alpha, rows, cols, accumulate,
                    stream);
}
template void column_sum<float>(float*, const float*, const float*, float, std::int64_t,
                                std::int64_t, bool, cudaStream_t);
template void column_sum<bf16>(bf16*, const bf16*, const bf16*, float, std::int64_t,
                               std::int64_t, bool, cudaStream_t);
template <class S>
void mse_loss_forward(float* out, const S* pred, const S* target, std::int64_t n,
                      cudaStream_t stream) {
  mse_loss_forward_kernel<S><<<1, kReduceThreads, 0, stream>>>(out, pred, target, n);
  GW_LAUNCH_CHECK();
}
template <class S>
void mse_loss_backward(S* dpred, S* dtarget, const float* dy, const S* pred, const S* target,
                       std::int64_t n, bool accumulate_pred, bool accumulate_target,
                       cudaStream_t stream) {
  mse_loss_backward_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(
      dpred, dtarget, dy, pred, target, n, accumulate_pred, accumulate_target);
  GW_LAUNCH_CHECK();
}

#define GW_REDUCE_INSTANTIATE(S)                                                                 \
  template void sum_forward<S>(float*, const S*, float, std::int64_t, cudaStream_t);            \
  template void sum_backward<S>(S*, const float*, float, std::int64_t, bool, cudaStream_t);     \
  template void mse_loss_forward<S>(float*, const S*, const S*, std::int64_t, cudaStream_t);    \
  template void mse_loss_backward<S>(S*, S*, const float*, const S*, const S*, std::int64_t,    \
                                     bool, bool, cudaStream_t);
GW_REDUCE_INSTANTIATE(float)
GW_REDUCE_INSTANTIATE(bf16)
#undef GW_REDUCE_INSTANTIATE

}  // namespace graphward::kernels
