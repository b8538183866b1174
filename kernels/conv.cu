// The convolution's bias gradient (the rest of convolution and pooling is cuDNN's, engine/runtime/dnn.h,
// and conv_nhwc.cu's): db[k] (=|+=) Σ_n Σ_hw dy[n, k, hw] (or the rows of a channels-last dy) —
// deterministic, in one or two passes; the weight and bias
// gradients of a convolution with few taps a filter; the bias and ReLU of a conv2d_relu in one
// pass after the convolution; and pooling's backward through the ReLU before it.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "graphward/kernels/block_reduce.cuh"
#include "graphward/kernels/conv.h"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::load;
using detail::put;

constexpr int kBiasThreads = 256;
constexpr std::int64_t kTargetBlocks = 264;  // two waves of a 132-SM GPU

// The images split into slices (a block per channel and slice): enough slices that channels x
// slices fills the GPU; `per` images each, the last maybe fewer.
struct Slices {
  std::int64_t per, count;
};
Slices image_slices(const ConvGeom& g) {
  const std::int64_t wanted =
      std::min(g.n, std::max<std::int64_t>(1, (kTargetBlocks + g.k - 1) / g.k));
  const std::int64_t per = (g.n + wanted - 1) / wanted;
  return {per, (g.n + per - 1) / per};
}

// Block (channel k, slice s): the sum of dy over the slice's images for channel k (a flat loop
// over its images' planes), into partial[s, k] — or, with one slice, into db itself.
template <class S>
__global__ void bias_grad_partial_kernel(float* partial, S* db, const S* dy, std::int64_t n,
                                         std::int64_t k, std::int64_t plane, std::int64_t per,
                                         bool accumulate) {
  const std::int64_t ch = blockIdx.x, slice = blockIdx.y;
  const std::int64_t n0 = slice * per, n1 = n0 + per < n ? n0 + per : n;
  const std::int64_t count = (n1 - n0) * plane;
  float acc = 0.f;
  for (std::int64_t t = threadIdx.x; t < count; t += kBiasThreads) {
    const std::int64_t img = n0 + t / plane;
    acc += load(dy, (img * k + ch) * plane + t % plane);
  }
  acc = block_reduce<kBiasThreads>(acc);
  if (threadIdx.x == 0) {
    if (partial) {
      partial[slice * k + ch] = acc;
    } else {
      put(db, ch, acc, accumulate);
    }
  }
}

// The bias gradient's second pass: db[ch] (=|+=) Σ over slices of partial[s · K + ch], in order.
template <class S>
__global__ void bias_slices_sum_kernel(S* db, const float* partial, std::int64_t slices,
                                       std::int64_t k, bool accumulate) {
  GW_GRID_STRIDE(ch, k) {
    float v = 0.f;
    for (std::int64_t s = 0; s < slices; ++s) v += partial[s * k + ch];
    put(db, ch, v, accumulate);
  }
}

// Thread per (channel, value): the slices' partial sums in order — partial[(s · K + ch) · values
// + j], the last value of a channel its bias gradient (db, may be null), the others its weight
// gradient's taps (dw [K, values − 1]). values = 1: the bias gradient alone.
template <class S>
__global__ void slices_sum_kernel(S* dw, S* db, const float* partial, std::int64_t slices,
                                  std::int64_t k, int values, bool accumulate_w,
                                  bool accumulate_b) {
  const std::int64_t per_slice = k * values;
  GW_GRID_STRIDE(i, per_slice) {
    float v = 0.f;
    for (std::int64_t s = 0; s < slices; ++s) v += partial[s * per_slice + i];
    const std::int64_t ch = i / values, j = i % values;
    if (j < values - 1) {
      put(dw, ch * (values - 1) + j, v, accumulate_w);
    } else if (db) {
      put(db, ch, v, accumulate_b);
    }
  }
}

// Channels last: dy is a [rows, K] matrix, rows = N·OH·OW, cut into slices of `per` rows (the
// last maybe fewer), enough to fill the GPU.
Slices row_slices(const ConvGeom& g) {
  const std::int64_t rows = g.n * g.out_h() * g.out_w();
  const std::int64_t wanted = std::clamp<std::int64_t>(rows / 512, 1, kTargetBlocks);
  const std::int64_t per = (rows + wanted - 1) / wanted;
  return {per, (rows + per - 1) / per};
}
Slices bias_slices(const ConvGeom& g) {
  return g.nhwc ? row_slices(g) : image_slices(g);
}

constexpr int kNhwcRowLanes = 8;  // a block: 32 columns x 8 row lanes

// Block `slice` of a channels-last bias gradient: for each 32 columns, thread (x, y) sums rows
// y, y + 8, ... of the slice in column x (reads along a row coalesced), then the 8 lanes in
// order; into partial[slice · K + ch] — or, with one slice, into db.
template <class S>
__global__ void bias_grad_nhwc_kernel(float* partial, S* db, const S* dy, std::int64_t rows,
                                      std::int64_t k, std::int64_t per, bool accumulate) {
  __shared__ float lanes[kNhwcRowLanes][33];
  const std::int64_t slice = blockIdx.x;
  const std::int64_t r0 = slice * per, r1 = r0 + per < rows ? r0 + per : rows;
  for (std::int64_t c0 = 0; c0 < k; c0 += 32) {
    const std::int64_t ch = c0 + threadIdx.x;
    // Four chains (rows y, y + 8, y + 16, y + 24 of each 32), added in a fixed order: four
    // loads in flight a thread.
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    if (ch < k) {
      constexpr int kStep = 4 * kNhwcRowLanes;
      std::int64_t r = r0 + threadIdx.y;
      for (; r + 3 * kNhwcRowLanes < r1; r += kStep) {
        a0 += load(dy, r * k + ch);
        a1 += load(dy, (r + kNhwcRowLanes) * k + ch);
        a2 += load(dy, (r + 2 * kNhwcRowLanes) * k + ch);
        a3 += load(dy, (r + 3 * kNhwcRowLanes) * k + ch);
      }
      for (; r < r1; r += kNhwcRowLanes) a0 += load(dy, r * k + ch);
    }
    lanes[threadIdx.y][threadIdx.x] = (a0 + a1) + (a2 + a3);
    __syncthreads();
    if (threadIdx.y == 0 && ch < k) {
      float v = 0.f;
      for (int y = 0; y < kNhwcRowLanes; ++y) v += lanes[y][threadIdx.x];
      if (partial) {
        partial[slice * k + ch] = v;
      } else {
        put(db, ch, v, accumulate);
      }
    }
    __syncthreads();
  }
}

}  // namespace

std::int64_t conv2d_bias_grad_workspace(const ConvGeom& g) {
  const std::int64_t slices = bias_slices(g).count;
  return slices > 1 ? slices * g.k : 0;
}

namespace {
constexpr int kWgradThreads = 256;
constexpr int kWgradMaxTaps = 32;                              // C·R·S of a filter
constexpr std::int64_t kWgradMaxWork = std::int64_t{1} << 25;  // N·OH·OW·K·taps

// Block (filter ch, slice): for each tap j = (c, r, s) of the filter, Σ over the slice's output
// positions (image, oy, ox) of dy · x at the tap (padding skipped), and Σ dy (the bias); each
// thread its own positions in order, then per value a fixed tree (warp shuffles, then the warps
// in order): deterministic. Into partial[(slice · K + ch) · (taps + 1) + j] (the bias last), or,
// with one slice (partial null), into dw [K, taps] and db [K] (may be null). kR: the filter's
// size, so that every tap's place is known at compile time (no table, no spilled registers).
template <int kR, class S>
__global__ void __launch_bounds__(kWgradThreads)
    weight_grad_small_kernel(float* partial, S* dw, S* db, const S* dy, const S* x,
                             int c, int h, int w, int k, int pad, int stride, int oh, int ow, int n,
                             int per, bool accumulate_w, bool accumulate_b) {
  constexpr int kArea = kR * kR, kMaxC = kWgradMaxTaps / kArea, kBias = kMaxC * kArea;
  __shared__ float warp_sums[kBias + 1][kWgradThreads / 32];
  const int taps = c * kArea, ch = blockIdx.x, slice = blockIdx.y;
  const int plane = oh * ow, hw = h * w, n0 = slice * per, n1 = n0 + per < n ? n0 + per : n;
  const int count = (n1 - n0) * plane;
  float acc[kBias + 1];
#pragma unroll
  for (int j = 0; j <= kBias; ++j) acc[j] = 0.f;
  for (int t = threadIdx.x; t < count; t += kWgradThreads) {
    const int img = n0 + t / plane, pos = t % plane;
    const int iy0 = pos / ow * stride - pad, ix0 = pos % ow * stride - pad;
    const float g = load(dy, (img * k + ch) * plane + pos);
    const S* xi = x + static_cast<std::int64_t>(img) * c * hw;
    bool row_in[kR], col_in[kR];
#pragma unroll
    for (int q = 0; q < kR; ++q) {
      row_in[q] = static_cast<unsigned>(iy0 + q) < static_cast<unsigned>(h);
      col_in[q] = static_cast<unsigned>(ix0 + q) < static_cast<unsigned>(w);
    }
    const int at = iy0 * w + ix0;  // x's index in the image at tap (0, 0, 0); may be outside
#pragma unroll
    for (int cc = 0; cc < kMaxC; ++cc) {
      if (cc < c) {
#pragma unroll
        for (int rr = 0; rr < kR; ++rr) {
#pragma unroll
          for (int ss = 0; ss < kR; ++ss) {
            if (row_in[rr] && col_in[ss]) {
              acc[(cc * kR + rr) * kR + ss] += g * load(xi, cc * hw + at + rr * w + ss);
            }
          }
        }
      }
    }
    acc[kBias] += g;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j <= kBias; ++j) {
    if (j < taps || j == kBias) {
      float v = acc[j];
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
      if (lane == 0) warp_sums[j][warp] = v;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) > taps) return;
  const int j = static_cast<int>(threadIdx.x) == taps ? kBias : threadIdx.x;  // `taps`: the bias
  float v = 0.f;
  for (int i = 0; i < kWgradThreads / 32; ++i) v += warp_sums[j][i];
  if (partial) {
    partial[(static_cast<std::int64_t>(slice) * k + ch) * (taps + 1) + threadIdx.x] = v;
  } else if (static_cast<int>(threadIdx.x) < taps) {
    put(dw, static_cast<std::int64_t>(ch) * taps + threadIdx.x, v, accumulate_w);
  } else if (db) {
    put(db, ch, v, accumulate_b);
  }
}

}  // namespace

bool conv2d_weight_grad_small_fits(const ConvGeom& g) {
  const std::int64_t taps = g.c * g.r * g.s;
  const std::int64_t positions = g.n * g.out_h() * g.out_w();
  // bfloat16 at any work: cuDNN's bfloat16 algorithms for so few channels are far slower still
  // (docs/DECISIONS.md, "a first convolution's bfloat16 weight gradient by our kernel at any size").
  // NCHW only: a channels-last weight gradient is cuDNN's.
  return !g.nhwc && g.r == g.s && taps >= 1 && taps <= kWgradMaxTaps && positions >= 1 && g.k >= 1 &&
         (g.bf16 || positions * g.k * taps <= kWgradMaxWork) && g.n * g.c * g.h * g.w <= INT_MAX &&
         positions * g.k <= INT_MAX;
}

std::int64_t conv2d_weight_grad_small_workspace(const ConvGeom& g) {
  const std::int64_t slices = image_slices(g).count;
  return slices > 1 ? slices * g.k * (g.c * g.r * g.s + 1) : 0;
}

template <class S>
void conv2d_weight_grad_small(S* dw, bool accumulate_w, S* db, bool accumulate_b, const S* dy,
                              const S* x, const ConvGeom& g, float* workspace,
                              cudaStream_t stream) {
  GW_CHECK(conv2d_weight_grad_small_fits(g), "conv2d_weight_grad_small: the geometry (", g.c, "x",
           g.r, "x", g.s, " taps, ", g.n, " images, ", g.k,
           " filters) is outside its range; expected conv2d_weight_grad_small_fits");
  const Slices slices = image_slices(g);
  const int taps = static_cast<int>(g.c * g.r * g.s);
  const dim3 grid(static_cast<unsigned>(g.k), static_cast<unsigned>(slices.count));
  auto i32 = [](std::int64_t v) { return static_cast<int>(v); };
  float* out = slices.count > 1 ? workspace : nullptr;
  // The filter's size as a template argument: r · r ≤ 32, so r ≤ 5.
  constexpr decltype(&weight_grad_small_kernel<1, S>) kKernels[] = {
      weight_grad_small_kernel<1, S>, weight_grad_small_kernel<2, S>,
      weight_grad_small_kernel<3, S>, weight_grad_small_kernel<4, S>,
      weight_grad_small_kernel<5, S>};
  kKernels[g.r - 1]<<<grid, kWgradThreads, 0, stream>>>(
      out, dw, db, dy, x, i32(g.c), i32(g.h), i32(g.w), i32(g.k), i32(g.pad), i32(g.stride),
      i32(g.out_h()), i32(g.out_w()), i32(g.n), i32(slices.per), accumulate_w, accumulate_b);
  GW_LAUNCH_CHECK();
  if (slices.count > 1) {
    const std::int64_t outputs = g.k * (taps + 1);
    slices_sum_kernel<S><<<detail::grid_for(outputs), detail::kThreads, 0, stream>>>(
        dw, db, workspace, slices.count, g.k, taps + 1, accumulate_w, accumulate_b);
    GW_LAUNCH_CHECK();
  }
}
template void conv2d_weight_grad_small<float>(float*, bool, float*, bool, const float*,
                                              const float*, const ConvGeom&, float*, cudaStream_t);
template void conv2d_weight_grad_small<bf16>(bf16*, bool, bf16*, bool, const bf16*, const bf16*,
                                             const ConvGeom&, float*, cudaStream_t);

namespace {
// I: the index type (int where every index fits: several times fewer instructions for the
// channel's division).
template <class S, class I>
__global__ void bias_act_kernel(S* y, const S* bias, I n, I plane, I k, bool relu) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    float v = load(y, i);
    if (bias) v = v + load(bias, (plane == 1 ? i : i / plane) % k);
    put(y, i, relu ? (v > 0.f || isnan(v) ? v : 0.f) : v);  // NaN stays NaN, as relu_forward
  }
}

// Channels last, bfloat16, K a multiple of 8: bias_act_kernel's arithmetic (bitwise), 8 elements
// a thread in one 16-byte load and store.
__global__ void bias_act_nhwc_bf16x8_kernel(bf16* y, const bf16* bias, int chunks, int k,
                                            bool relu) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += gridDim.x * blockDim.x) {
    uint4 raw = reinterpret_cast<const uint4*>(y)[i];
    __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(&raw);
    const int c0 = (i * 8) % k;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 v = __bfloat1622float2(pair[q]);
      if (bias) {
        v.x = v.x + load(bias, c0 + 2 * q);
        v.y = v.y + load(bias, c0 + 2 * q + 1);
      }
      if (relu) {
        v.x = v.x > 0.f || isnan(v.x) ? v.x : 0.f;
        v.y = v.y > 0.f || isnan(v.y) ? v.y : 0.f;
      }
      pair[q] = __floats2bfloat162_rn(v.x, v.y);
    }
    reinterpret_cast<uint4*>(y)[i] = raw;
  }
}

}  // namespace

template <class S>
void conv2d_bias_act(S* y, const S* bias, const ConvGeom& g, bool relu, cudaStream_t stream) {
  // Channels last: the channel is the innermost index (a "plane" of one element).
  const std::int64_t plane = g.nhwc ? 1 : g.out_h() * g.out_w();
  const std::int64_t n = g.n * g.k * g.out_h() * g.out_w();
  if (n == 0) return;
  if constexpr (std::is_same_v<S, bf16>) {
    if (g.nhwc && g.k % 8 == 0 && n < (std::int64_t{1} << 30) &&
        reinterpret_cast<std::uintptr_t>(y) % 16 == 0) {
      const int chunks = static_cast<int>(n / 8);
      bias_act_nhwc_bf16x8_kernel<<<detail::grid_for(chunks), detail::kThreads, 0, stream>>>(
          y, bias, chunks, static_cast<int>(g.k), relu);
      GW_LAUNCH_CHECK();
      return;
    }
  }
  if (n < (std::int64_t{1} << 30)) {
    bias_act_kernel<S, int><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
        y, bias, static_cast<int>(n), static_cast<int>(plane), static_cast<int>(g.k), relu);
  } else {
    bias_act_kernel<S, std::int64_t>
        <<<detail::grid_for(n), detail::kThreads, 0, stream>>>(y, bias, n, plane, g.k, relu);
  }
  GW_LAUNCH_CHECK();
}
template void conv2d_bias_act<float>(float*, const float*, const ConvGeom&, bool, cudaStream_t);
template void conv2d_bias_act<bf16>(bf16*, const bf16*, const ConvGeom&, bool, cudaStream_t);

namespace {
// The geometry of a pooling in the kernel's index type I (int where every index fits).
template <class I>
struct PoolDims {
  I h, w, window, pad, stride, oh_n, ow_n;
};

template <class I>
__device__ __forceinline__ I imax(I a, I b) {
  return a > b ? a : b;
}
template <class I>
__device__ __forceinline__ I imin(I a, I b) {
  return a < b ? a : b;
}

// The gradient pooling sends back through the ReLU to the input element of value v at (ih, iw):
// 0 unless v is positive; else the sum over the windows that hold it, in row-major order — max:
// each window's gradient where v is the window's first element (row-major, inside the image)
// equal to its maximum; average: each window's gradient over its area. x_plane: the element's
// plane (its image's channel) at pixel 0; `out`: that plane's first output; pixels and outputs
// `step` elements apart (1: NCHW; C: channels last). kDisjoint: windows of stride = size and no
// padding (at most one window holds an element).
template <PoolMode kMode, bool kDisjoint, class I, class S>
__device__ __forceinline__ float pool_relu_grad_at(const S* dy, const S* y, const S* x_plane,
                                                   I out, I step, I ih, I iw, float v, I window,
                                                   const PoolDims<I>& d) {
  float acc = 0.f;
  if (!(v > 0.f)) return acc;
  const float area = static_cast<float>(window * window);
  // Windows oh with oh·stride - pad <= ih < oh·stride - pad + window (likewise ow).
  I oh0, ow0, oh1, ow1;
  if constexpr (kDisjoint) {
    oh0 = oh1 = ih / window;
    ow0 = ow1 = iw / window;
    if (oh0 >= d.oh_n || ow0 >= d.ow_n) oh1 = oh0 - 1;  // in no window
  } else {
    oh0 = imax<I>(0, (ih + d.pad - window + d.stride) / d.stride);
    ow0 = imax<I>(0, (iw + d.pad - window + d.stride) / d.stride);
    oh1 = imin<I>(d.oh_n - 1, (ih + d.pad) / d.stride);
    ow1 = imin<I>(d.ow_n - 1, (iw + d.pad) / d.stride);
  }
  for (I oh = oh0; oh <= oh1; ++oh) {
    for (I ow = ow0; ow <= ow1; ++ow) {
      const I o = out + (oh * d.ow_n + ow) * step;
      if constexpr (kMode == PoolMode::kAverage) {
        acc += load(dy, o) / area;
      } else {
        const float m = load(y, o);
        // Whether no element before this one in the window (row-major, inside the image)
        // equals m.
        const I h0 = imax<I>(0, oh * d.stride - d.pad);
        const I w0 = imax<I>(0, ow * d.stride - d.pad);
        const I w_end = imin<I>(d.w, ow * d.stride - d.pad + window);
        bool first = v == m;
        for (I h = h0; h <= ih && first; ++h) {
          for (I w = w0; w < (h < ih ? w_end : iw); ++w) {
            if (load(x_plane, (h * d.w + w) * step) == m) {
              first = false;
              break;
            }
          }
        }
        if (first) acc += load(dy, o);
      }
    }
  }
  return acc;
}

// NCHW: a thread per input element (plane p, row ih, column iw; blocks of a plane along x, planes
// along y), its gradient by pool_relu_grad_at. Windows of size kWindow (0: d.window).
template <PoolMode kMode, bool kDisjoint, int kWindow, class I, class S>
__global__ void pool_backward_relu_kernel(S* dx, const S* dy, const S* x, const S* y, I planes,
                                          PoolDims<I> d, bool accumulate) {
  const I window = kWindow > 0 ? I{kWindow} : d.window;
  const I plane_n = d.h * d.w;
  for (I p = blockIdx.y; p < planes; p += gridDim.y) {
    for (I j = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; j < plane_n;
         j += static_cast<I>(gridDim.x) * blockDim.x) {
      const I ih = j / d.w, iw = j - ih * d.w, i = p * plane_n + j;
      const float acc = pool_relu_grad_at<kMode, kDisjoint>(
          dy, y, x + p * plane_n, p * d.oh_n * d.ow_n, I{1}, ih, iw, load(x, i), window, d);
      put(dx, i, acc, accumulate);
    }
  }
}

// Channels last: a thread per input element i = ((n · H + ih) · W + iw) · C + c (consecutive
// threads along the channels: coalesced), its gradient by pool_relu_grad_at, the window's
// elements C apart.
template <PoolMode kMode, bool kDisjoint, int kWindow, class I, class S>
__global__ void pool_backward_relu_nhwc_kernel(S* dx, const S* dy, const S* x, const S* y,
                                               I count, I c_n, PoolDims<I> d, bool accumulate) {
  const I window = kWindow > 0 ? I{kWindow} : d.window;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c = i % c_n, pix = i / c_n;
    const I iw = pix % d.w, rest = pix / d.w;
    const I ih = rest % d.h, n = rest / d.h;
    const float acc = pool_relu_grad_at<kMode, kDisjoint>(
        dy, y, x + n * d.h * d.w * c_n + c, n * d.oh_n * d.ow_n * c_n + c, c_n, ih, iw,
        load(x, i), window, d);
    put(dx, i, acc, accumulate);
  }
}

// Channels last, windows of stride = size, no padding, tiling the image (H and W multiples of
// the size): a thread per output element ((n · OH + oh) · OW + ow) · C + c, which writes every
// input element of its window — the same sums as pool_backward_relu_nhwc_kernel's (at most one
// window holds an element), x read once.
template <PoolMode kMode, int kWindow, class I, class S>
__global__ void pool_backward_relu_tiled_nhwc_kernel(S* dx, const S* dy, const S* x, const S* y,
                                                     I outputs, I c_n, PoolDims<I> d,
                                                     bool accumulate) {
  constexpr I window = kWindow;
  const float area = static_cast<float>(window * window);
  for (I o = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c = o % c_n, pix = o / c_n;
    const I ow = pix % d.ow_n, rest = pix / d.ow_n;
    const I oh = rest % d.oh_n, n = rest / d.oh_n;
    const float g = load(dy, o);
    const float m = kMode == PoolMode::kMax ? load(y, o) : 0.f;
    bool taken = false;  // max: the window's first maximum took the gradient
#pragma unroll
    for (I r = 0; r < window; ++r) {
#pragma unroll
      for (I s = 0; s < window; ++s) {
        const I i = ((n * d.h + oh * window + r) * d.w + ow * window + s) * c_n + c;
        const float v = load(x, i);
        float acc = 0.f;
        if constexpr (kMode == PoolMode::kAverage) {
          if (v > 0.f) acc = g / area;
        } else {
          if (!taken && v == m) {
            taken = true;
            if (v > 0.f) acc = g;
          }
        }
        put(dx, i, acc, accumulate);
      }
    }
  }
}

template <PoolMode kMode, class I, class S>
void launch_pool_backward_relu(S* dx, const S* dy, const S* x, const S* y, const PoolGeom& g,
                               bool accumulate, cudaStream_t stream) {
  const PoolDims<I> d{static_cast<I>(g.h),      static_cast<I>(g.w),      static_cast<I>(g.window),
                      static_cast<I>(g.pad),    static_cast<I>(g.stride), static_cast<I>(g.out_h()),
                      static_cast<I>(g.out_w())};
  const bool disjoint = g.stride == g.window && g.pad == 0;
  if (g.nhwc && disjoint && g.window == 2 && g.h % 2 == 0 && g.w % 2 == 0) {
    const std::int64_t outputs = g.n * g.out_h() * g.out_w() * g.c;
    pool_backward_relu_tiled_nhwc_kernel<kMode, 2, I, S>
        <<<detail::grid_for(outputs), detail::kThreads, 0, stream>>>(
            dx, dy, x, y, static_cast<I>(outputs), static_cast<I>(g.c), d, accumulate);
    GW_LAUNCH_CHECK();
    return;
  }
  // NCHW: blocks of a plane along x, planes along y; channels last: a flat grid.
  const std::int64_t count = g.n * g.c * g.h * g.w;
  const std::int64_t plane_blocks = (g.h * g.w + detail::kThreads - 1) / detail::kThreads;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(plane_blocks, 1024)),
                  static_cast<unsigned>(std::min<std::int64_t>(g.n * g.c, 65535)));
  auto launch = [&]<bool kDisjoint, int kWindow>() {
    if (g.nhwc) {
      pool_backward_relu_nhwc_kernel<kMode, kDisjoint, kWindow, I, S>
          <<<detail::grid_for(count), detail::kThreads, 0, stream>>>(
              dx, dy, x, y, static_cast<I>(count), static_cast<I>(g.c), d, accumulate);
    } else {
      pool_backward_relu_kernel<kMode, kDisjoint, kWindow, I, S>
          <<<grid, detail::kThreads, 0, stream>>>(dx, dy, x, y, static_cast<I>(g.n * g.c), d,
                                                  accumulate);
    }
  };
  if (disjoint && g.window == 2) {
    launch.template operator()<true, 2>();
  } else if (disjoint) {
    launch.template operator()<true, 0>();
  } else {
    launch.template operator()<false, 0>();
  }
  GW_LAUNCH_CHECK();
}

template <PoolMode kMode, class S>
void launch_pool_backward_relu(S* dx, const S* dy, const S* x, const S* y, std::int64_t n,
                               const PoolGeom& g, bool accumulate, cudaStream_t stream) {
  // 32-bit indices (several times fewer instructions for the divisions) where every index and
  // every sum of sizes (a window's end: at most four times the input's or the output's count)
  // fits with room to spare.
  const std::int64_t outputs = g.n * g.c * g.out_h() * g.out_w();
  if (std::max(n, outputs) < (std::int64_t{1} << 28)) {
    launch_pool_backward_relu<kMode, int, S>(dx, dy, x, y, g, accumulate, stream);
  } else {
    launch_pool_backward_relu<kMode, std::int64_t, S>(dx, dy, x, y, g, accumulate, stream);
  }
}
}  // namespace

template <class S>
void pool2d_backward_relu(PoolMode mode, S* dx, const S* dy, const S* x, const S* y,
                          const PoolGeom& g, bool accumulate, cudaStream_t stream) {
  const std::int64_t n = g.n * g.c * g.h * g.w;
  if (n == 0) return;
  if (mode == PoolMode::kMax) {
    launch_pool_backward_relu<PoolMode::kMax, S>(dx, dy, x, y, n, g, accumulate, stream);
  } else {
    launch_pool_backward_relu<PoolMode::kAverage, S>(dx, dy, x, y, n, g, accumulate, stream);
  }
}
template void pool2d_backward_relu<float>(PoolMode, float*, const float*, const float*,
                                          const float*, const PoolGeom&, bool, cudaStream_t);
template void pool2d_backward_relu<bf16>(PoolMode, bf16*, const bf16*, const bf16*, const bf16*,
                                         const PoolGeom&, bool, cudaStream_t);

template <class S>
void conv2d_bias_grad(S* db, const S* dy, const ConvGeom& g, bool accumulate, float* workspace,
                      cudaStream_t stream) {
  if (g.nhwc) {
    const auto [per, slices] = row_slices(g);
    bias_grad_nhwc_kernel<S><<<static_cast<unsigned>(slices), dim3(32, kNhwcRowLanes), 0,
                               stream>>>(slices > 1 ? workspace : nullptr, db, dy,
                                         g.n * g.out_h() * g.out_w(), g.k, per, accumulate);
    GW_LAUNCH_CHECK();
    if (slices > 1) {
      bias_slices_sum_kernel<S><<<detail::grid_for(g.k), detail::kThreads, 0, stream>>>(
          db, workspace, slices, g.k, accumulate);
      GW_LAUNCH_CHECK();
    }
    return;
  }
  const std::int64_t plane = g.out_h() * g.out_w();
  const auto [per, slices] = image_slices(g);
  const dim3 grid(static_cast<unsigned>(g.k), static_cast<unsigned>(slices));
  bias_grad_partial_kernel<S><<<grid, kBiasThreads, 0, stream>>>(
      slices > 1 ? workspace : nullptr, db, dy, g.n, g.k, plane, per, accumulate);
  GW_LAUNCH_CHECK();
  if (slices > 1) {
    bias_slices_sum_kernel<S><<<detail::grid_for(g.k), detail::kThreads, 0, stream>>>(
        db, workspace, slices, g.k, accumulate);
    GW_LAUNCH_CHECK();
  }
}
template void conv2d_bias_grad<float>(float*, const float*, const ConvGeom&, bool, float*,
                                      cudaStream_t);
template void conv2d_bias_grad<bf16>(bf16*, const bf16*, const ConvGeom&, bool, float*,
                                     cudaStream_t);

}  // namespace graphward::kernels
