// Shape kernels: one thread per output element in a grid-stride loop. Contract in shape.h.
#include "kernels/launch.cuh"
#include "kernels/shape.h"
#include "kernels/swap_dims.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;
using detail::store;

__global__ void gather_window_kernel(float* y, const float* x, std::int64_t rows,
                                     std::int64_t cols, std::int64_t start, std::int64_t len,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, rows * len) {
    store(y, i, x[(i / len) * cols + start + i % len], accumulate);
  }
}

__global__ void scatter_window_kernel(float* y, const float* x, std::int64_t rows,
                                      std::int64_t cols, std::int64_t start, std::int64_t len,
                                      bool accumulate) {
  GW_GRID_STRIDE(i, rows * len) {
    store(y, (i / len) * cols + start + i % len, x[i], accumulate);
  }
}

__global__ void swap_dims_kernel(float* y, const float* x, SwapDims dims, std::int64_t n,
                                 bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(y, i, x[detail::swapped_source(dims, i)], accumulate);
  }
}

}  // namespace

void gather_window(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                   std::int64_t start, std::int64_t len, bool accumulate, cudaStream_t stream) {
  gather_window_kernel<<<grid_for(rows * len), kThreads, 0, stream>>>(y, x, rows, cols, start, len,
                                                                     accumulate);
  GW_LAUNCH_CHECK();
}

void scatter_window(float* y, const float* x, std::int64_t rows, std::int64_t cols,
                    std::int64_t start, std::int64_t len, bool accumulate, cudaStream_t stream) {
  scatter_window_kernel<<<grid_for(rows * len), kThreads, 0, stream>>>(y, x, rows, cols, start,
                                                                      len, accumulate);
  GW_LAUNCH_CHECK();
}

void swap_dims(float* y, const float* x, const SwapDims& dims, bool accumulate,
               cudaStream_t stream) {
  std::int64_t n = 1;
  for (int k = 0; k < dims.rank; ++k) n *= dims.in_shape[k];
  swap_dims_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, dims, n, accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
