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

template <class Index>
__global__ void swap_dims_kernel(float* y, const float* x, detail::Swap5 dims, Index n,
                                 bool accumulate) {
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    store(y, i, x[detail::swapped_source<Index>(dims, i)], accumulate);
  }
}

__global__ void copy_kernel(float* y, const float* x, std::int64_t n, bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(y, i, x[i], accumulate);
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
  const detail::Swap5 s = detail::collapse(dims);
  if (s.c == 0) {  // the same dimension twice: a copy
    copy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n, accumulate);
  } else if (n <= static_cast<std::int64_t>(UINT32_MAX)) {  // 32-bit index arithmetic: faster
    swap_dims_kernel<std::uint32_t><<<grid_for(n), kThreads, 0, stream>>>(
        y, x, s, static_cast<std::uint32_t>(n), accumulate);
  } else {
    swap_dims_kernel<std::int64_t><<<grid_for(n), kThreads, 0, stream>>>(y, x, s, n, accumulate);
  }
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
