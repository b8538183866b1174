// Shape kernels: one thread per output element in a grid-stride loop. Contract in shape.h.
#include <algorithm>
#include <type_traits>

#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/shape.h"
#include "graphward/kernels/storage.cuh"
#include "graphward/kernels/swap_dims.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;
using detail::load;
using detail::put;

// S: float or bf16 (storage; an accumulated element is summed in float32, then stored).
template <class S>
__global__ void gather_window_kernel(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                                     std::int64_t start, std::int64_t len, bool accumulate) {
  GW_GRID_STRIDE(i, rows * len) {
    put(y, i, load(x, (i / len) * cols + start + i % len), accumulate);
  }
}

template <class S>
__global__ void scatter_window_kernel(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                                      std::int64_t start, std::int64_t len, bool accumulate) {
  GW_GRID_STRIDE(i, rows * len) {
    put(y, (i / len) * cols + start + i % len, load(x, i), accumulate);
  }
}

// V: float, or float4 where the window, the heads and the rows are whole float4s (the layout's
// sizes then count float4s). A copy either way: the same bits.
__device__ __forceinline__ float add(float a, float b) {
  return a + b;
}
__device__ __forceinline__ float4 add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
template <class V>
__device__ __forceinline__ V zero();
template <>
__device__ __forceinline__ float zero<float>() {
  return 0.f;
}
template <>
__device__ __forceinline__ float4 zero<float4>() {
  return make_float4(0.f, 0.f, 0.f, 0.f);
}
template <>
__device__ __forceinline__ bf16 zero<bf16>() {
  return bf16{};  // +0
}
// dst = v, or dst += v (for bfloat16 the sum in float32, rounded once).
template <class V>
__device__ __forceinline__ void assign(V& dst, V v, bool accumulate) {
  dst = accumulate ? add(dst, v) : v;
}
__device__ __forceinline__ void assign(bf16& dst, bf16 v, bool accumulate) {
  if (accumulate) {
    put(&dst, 0, load(&dst, 0) + load(&v, 0));
  } else {
    dst = v;
  }
}

// V: float, or float4 where the innermost run (dims.c) is whole float4s (dims.c then counts them).
template <class V, class Index>
__global__ void swap_dims_kernel(V* y, const V* x, detail::Swap5 dims, Index n, bool accumulate) {
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    assign(y[i], x[detail::swapped_source<Index>(dims, i)], accumulate);
  }
}

template <class V, class Index>
__global__ void split_heads_kernel(V* y, const V* x, HeadsWindow w, Index n) {
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    y[i] = x[detail::heads_source<Index>(w, i)];
  }
}

// Without accumulate: every element of dx (zeros outside the window); with it: the window's.
template <class V, class Index>
__global__ void split_heads_backward_kernel(V* dx, const V* dy, HeadsWindow w, Index n,
                                            bool accumulate) {
  const Index len = static_cast<Index>(w.heads * w.dim), cols = static_cast<Index>(w.cols),
              start = static_cast<Index>(w.start);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    if (accumulate) {
      const Index row = i / len, c = i % len;
      assign(dx[row * cols + start + c], dy[detail::heads_target<Index>(w, row, c)], true);
    } else {
      const Index row = i / cols, c = i % cols;
      dx[i] = c >= start && c - start < len ? dy[detail::heads_target<Index>(w, row, c - start)]
                                            : zero<V>();
    }
  }
}

// Calls launch(V*, layout) with float4s where the layout and both pointers allow, else the
// elements one at a time (bfloat16: always).
template <class S, class Launch>
void by_vector_width(S* a, const S* b, const HeadsWindow& w, Launch launch) {
  if (std::is_same_v<S, float> && w.dim % 4 == 0 && w.start % 4 == 0 && w.cols % 4 == 0 &&
      detail::all_16_byte_aligned(a, b)) {
    HeadsWindow w4 = w;
    w4.dim /= 4;
    w4.start /= 4;
    w4.cols /= 4;
    launch(reinterpret_cast<float4*>(a), reinterpret_cast<const float4*>(b), w4);
  } else {
    launch(a, b, w);
  }
}

// Calls launch(Index{}) with Index = std::uint32_t where every index the kernel computes fits
// (`fits_32`: 32-bit index arithmetic is faster), else std::int64_t; then checks the launch.
template <class Launch>
void by_index_width(bool fits_32, Launch launch) {
  if (fits_32) {
    launch(std::uint32_t{});
  } else {
    launch(std::int64_t{});
  }
  GW_LAUNCH_CHECK();
}

template <class S>
__global__ void copy_kernel(S* y, const S* x, std::int64_t n, bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    put(y, i, load(x, i), accumulate);
  }
}

// Segment blockIdx.y: 16-byte vectors by a grid-stride loop where both ends are 16-byte aligned,
// then 4-byte words the same way, then the 1 to 3 bytes past them.
template <int N>
__global__ void copy_segments_kernel(SegmentList<N> s) {
  const int k = static_cast<int>(blockIdx.y);
  const auto* src = static_cast<const unsigned char*>(s.src[k]);
  auto* dst = static_cast<unsigned char*>(s.dst[k]);
  const std::int64_t bytes = s.bytes[k];
  std::int64_t done = 0;
  if (detail::all_16_byte_aligned(src, dst)) {
    const std::int64_t vectors = bytes / 16;
    GW_GRID_STRIDE(i, vectors) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
    done = 16 * vectors;
  }
  const std::int64_t words = (bytes - done) / 4;
  GW_GRID_STRIDE(i, words) {
    reinterpret_cast<std::uint32_t*>(dst + done)[i] =
        reinterpret_cast<const std::uint32_t*>(src + done)[i];
  }
  done += 4 * words;
  const std::int64_t tail = bytes - done;
  if (blockIdx.x == 0 && static_cast<std::int64_t>(threadIdx.x) < tail) {
    dst[done + threadIdx.x] = src[done + threadIdx.x];
  }
}

template <int N>
void copy_segment_list(const SegmentList<N>& segments, cudaStream_t stream) {
  GW_CHECK(segments.count >= 0 && segments.count <= N, "copy_segments: ", segments.count,
           " segments; expected 0 to ", N);
  std::int64_t most = 0;
  for (int k = 0; k < segments.count; ++k) {
    GW_CHECK(reinterpret_cast<std::uintptr_t>(segments.src[k]) % 4 == 0 &&
                 reinterpret_cast<std::uintptr_t>(segments.dst[k]) % 4 == 0,
             "copy_segments: segment ", k, " is not 4-byte aligned");
    GW_CHECK(segments.bytes[k] >= 0, "copy_segments: segment ", k, " has ", segments.bytes[k],
             " bytes; expected 0 or more");
    most = std::max(most, segments.bytes[k] / 4);
  }
  if (segments.count == 0) return;
  const dim3 grid(std::max(1u, grid_for(most) / static_cast<unsigned>(segments.count)),
                  static_cast<unsigned>(segments.count));
  copy_segments_kernel<N><<<grid, kThreads, 0, stream>>>(segments);
  GW_LAUNCH_CHECK();
}

}  // namespace

void copy_segments(const Segments& segments, cudaStream_t stream) {
  copy_segment_list(segments, stream);
}
void copy_segments(const FewSegments& segments, cudaStream_t stream) {
  copy_segment_list(segments, stream);
}

template <class S>
void gather_window(S* y, const S* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                   std::int64_t len, bool accumulate, cudaStream_t stream) {
  gather_window_kernel<<<grid_for(rows * len), kThreads, 0, stream>>>(y, x, rows, cols, start, len,
                                                                      accumulate);
  GW_LAUNCH_CHECK();
}

template <class S>
void scatter_window(S* y, const S* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                    std::int64_t len, bool accumulate, cudaStream_t stream) {
  scatter_window_kernel<<<grid_for(rows * len), kThreads, 0, stream>>>(y, x, rows, cols, start, len,
                                                                       accumulate);
  GW_LAUNCH_CHECK();
}

template <class S>
void swap_dims(S* y, const S* x, const SwapDims& dims, bool accumulate, cudaStream_t stream) {
  std::int64_t n = 1;
  for (int k = 0; k < dims.rank; ++k) n *= dims.in_shape[k];
  const detail::Swap5 s = detail::collapse(dims);
  if (s.c == 0) {  // the same dimension twice: a copy
    copy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n, accumulate);
    GW_LAUNCH_CHECK();
    return;
  }
  auto launch = [&]<class V>(V* yv, const V* xv, const detail::Swap5& l, std::int64_t count) {
    by_index_width(count <= static_cast<std::int64_t>(UINT32_MAX), [&]<class Index>(Index) {
      swap_dims_kernel<V, Index><<<grid_for(count), kThreads, 0, stream>>>(
          yv, xv, l, static_cast<Index>(count), accumulate);
    });
  };
  if constexpr (std::is_same_v<S, float>) {
    if (s.c % 4 == 0 && detail::all_16_byte_aligned(y, x)) {  // four floats a load: the same bits
      detail::Swap5 s4 = s;
      s4.c /= 4;
      launch(reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(x), s4, n / 4);
      return;
    }
  }
  launch(y, x, s, n);
}

template <class S>
void split_heads(S* y, const S* x, const HeadsWindow& w, cudaStream_t stream) {
  by_vector_width(y, x, w, [&]<class V>(V* yv, const V* xv, const HeadsWindow& l) {
    const std::int64_t n = l.batch * l.heads * l.seq * l.dim;
    if (n == 0) return;
    // 32-bit index arithmetic where every offset into x fits (x is the larger).
    by_index_width(l.batch * l.seq * l.cols <= static_cast<std::int64_t>(UINT32_MAX),
                   [&]<class Index>(Index) {
                     split_heads_kernel<V, Index>
                         <<<grid_for(n), kThreads, 0, stream>>>(yv, xv, l, static_cast<Index>(n));
                   });
  });
}

template <class S>
void split_heads_backward(S* dx, const S* dy, const HeadsWindow& w, bool accumulate,
                          cudaStream_t stream) {
  by_vector_width(dx, dy, w, [&]<class V>(V* dxv, const V* dyv, const HeadsWindow& l) {
    const std::int64_t n = l.batch * l.seq * (accumulate ? l.heads * l.dim : l.cols);
    if (n == 0) return;
    by_index_width(l.batch * l.seq * l.cols <= static_cast<std::int64_t>(UINT32_MAX),
                   [&]<class Index>(Index) {
                     split_heads_backward_kernel<V, Index><<<grid_for(n), kThreads, 0, stream>>>(
                         dxv, dyv, l, static_cast<Index>(n), accumulate);
                   });
  });
}

#define GW_SHAPE_INSTANTIATE(S)                                                                   \
  template void gather_window(S*, const S*, std::int64_t, std::int64_t, std::int64_t,            \
                              std::int64_t, bool, cudaStream_t);                                 \
  template void scatter_window(S*, const S*, std::int64_t, std::int64_t, std::int64_t,           \
                               std::int64_t, bool, cudaStream_t);                                \
  template void swap_dims(S*, const S*, const SwapDims&, bool, cudaStream_t);                    \
  template void split_heads(S*, const S*, const HeadsWindow&, cudaStream_t);                     \
  template void split_heads_backward(S*, const S*, const HeadsWindow&, bool, cudaStream_t);
GW_SHAPE_INSTANTIATE(float)
GW_SHAPE_INSTANTIATE(bf16)
#undef GW_SHAPE_INSTANTIATE

}  // namespace graphward::kernels
