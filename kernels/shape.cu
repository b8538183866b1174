// Shape kernels: one thread per output element in a grid-stride loop. Contract in shape.h.
#include <algorithm>

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

// Segment blockIdx.y: 4-byte words by a grid-stride loop, then the 1 to 3 bytes past them.
__global__ void copy_segments_kernel(Segments s) {
  const int k = static_cast<int>(blockIdx.y);
  const auto* src = static_cast<const std::uint32_t*>(s.src[k]);
  auto* dst = static_cast<std::uint32_t*>(s.dst[k]);
  const std::int64_t words = s.bytes[k] / 4;
  GW_GRID_STRIDE(i, words) {
    dst[i] = src[i];
  }
  const std::int64_t tail = s.bytes[k] - 4 * words;
  if (blockIdx.x == 0 && static_cast<std::int64_t>(threadIdx.x) < tail) {
    reinterpret_cast<unsigned char*>(dst + words)[threadIdx.x] =
        reinterpret_cast<const unsigned char*>(src + words)[threadIdx.x];
  }
}

}  // namespace

void copy_segments(const Segments& segments, cudaStream_t stream) {
  GW_CHECK(segments.count >= 0 && segments.count <= kMaxSegments, "copy_segments: ",
           segments.count, " segments; expected 0 to ", kMaxSegments);
  std::int64_t most = 0;
  for (int k = 0; k < segments.count; ++k) {
    GW_CHECK(reinterpret_cast<std::uintptr_t>(segments.src[k]) % 4 == 0 &&
                 reinterpret_cast<std::uintptr_t>(segments.dst[k]) % 4 == 0,
             "copy_segments: segment ", k, " is not 4-byte aligned");
    most = std::max(most, segments.bytes[k] / 4);
  }
  if (segments.count == 0) return;
  const dim3 grid(std::max(1u, grid_for(most) / static_cast<unsigned>(segments.count)),
                  static_cast<unsigned>(segments.count));
  copy_segments_kernel<<<grid, kThreads, 0, stream>>>(segments);
  GW_LAUNCH_CHECK();
}

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
