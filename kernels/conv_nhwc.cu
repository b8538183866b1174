// Channels-last kernels of ours (kernels/conv.h): a few-tap convolution's patches and padded
// filters (its forward and weight gradient as GEMMs, engine/ops/ops_conv.cpp), and 2x2 poolings that
// tile the image. The rest of convolution and pooling is conv.cu's and cuDNN's.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "graphward/kernels/conv.h"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::load;
using detail::put;

// Thread per 8 columns of a row of cols [rows, ld] (ld a multiple of 8): row p = (image, oy, ox),
// column j = (r, s, c) of the filter's [R, S, C] order, stepped through in order.
constexpr int kPatchChunk = 8;
// Column `ones` (none where it is ld or more) holds 1s.
template <class S, class I>
__global__ void patches_nhwc_kernel(S* cols, const S* x, I chunks, I ld, I taps, I ones, I c,
                                    I h, I w, I s, I pad, I stride, I oh, I ow) {
  const I per_row = ld / kPatchChunk;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I p = i / per_row, j0 = (i - p * per_row) * kPatchChunk;
    const I ox = p % ow, rest = p / ow;
    const I oy = rest % oh, img = rest / oh;
    I cc = j0 % c, tap = j0 / c;
    I ss = tap % s, rr = tap / s;
    S* out = cols + p * ld + j0;
    float v[kPatchChunk];
#pragma unroll
    for (int q = 0; q < kPatchChunk; ++q) {
      v[q] = 0.f;
      if (j0 + q < taps) {
        const I iy = oy * stride - pad + rr, ix = ox * stride - pad + ss;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) {
          v[q] = load(x, ((img * h + iy) * w + ix) * c + cc);
        }
        if (++cc == c) {
          cc = 0;
          if (++ss == s) {
            ss = 0;
            ++rr;
          }
        }
      } else if (j0 + q == ones) {
        v[q] = 1.f;
      }
    }
    if constexpr (std::is_same_v<S, bf16>) {  // one 16-byte store (cols is 16-byte aligned)
      uint4 raw;
      __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
      for (int q = 0; q < kPatchChunk / 2; ++q) {
        pair[q] = __floats2bfloat162_rn(v[2 * q], v[2 * q + 1]);
      }
      *reinterpret_cast<uint4*>(out) = raw;
    } else {
#pragma unroll
      for (int q = 0; q < kPatchChunk; ++q) put(out, q, v[q], false);
    }
  }
}

// dw [K, taps] (=|+=) g's columns [0, taps), db [K] (=|+=) its column taps (db may be null).
template <class S>
__global__ void split_patch_grads_kernel(S* dw, bool accumulate_w, S* db, bool accumulate_b,
                                         const S* g, int count, int taps, int ld) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const int j = i % (taps + 1), r = i / (taps + 1);
    const float v = load(g, r * ld + j);
    if (j < taps) {
      put(dw, r * taps + j, v, accumulate_w);
    } else if (db) {
      put(db, r, v, accumulate_b);
    }
  }
}

// dst [K, ld] = w [K, taps] with zero columns from taps on: a filter as a row of patches.
template <class S>
__global__ void pad_filters_kernel(S* dst, const S* w, int count, int taps, int ld) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const int j = i % ld, r = i / ld;
    put(dst, i, j < taps ? load(w, r * taps + j) : 0.f, false);
  }
}
template <PoolMode kMode, class S>
__global__ void pool_forward_tiled_nhwc_kernel(S* y, const S* x, int outputs, int c_n, int h,
                                               int w, int oh_n, int ow_n) {
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < outputs; o += gridDim.x * blockDim.x) {
    const int c = o % c_n, pix = o / c_n;
    const int ow = pix % ow_n, rest = pix / ow_n;
    const int oh = rest % oh_n, n = rest / oh_n;
    const int i0 = ((n * h + 2 * oh) * w + 2 * ow) * c_n + c;
    const float v[4] = {load(x, i0), load(x, i0 + c_n), load(x, i0 + w * c_n),
                        load(x, i0 + (w + 1) * c_n)};
    float r;
    if constexpr (kMode == PoolMode::kMax) {
      r = v[0];
      for (int q = 1; q < 4; ++q) {
        if (!isnan(r) && (isnan(v[q]) || v[q] > r)) r = v[q];
      }
    } else {
      r = (((v[0] + v[1]) + v[2]) + v[3]) / 4.f;
    }
    put(y, o, r, false);
  }
}

}  // namespace

template <class S>
void conv2d_patches_nhwc(S* cols, const S* x, const ConvGeom& g, std::int64_t ld,
                         cudaStream_t stream, bool ones) {
  GW_CHECK(g.nhwc && ld >= g.c * g.r * g.s, "conv2d_patches_nhwc: expected a channels-last "
           "geometry and ld >= C·R·S");
  GW_CHECK(ld % kPatchChunk == 0, "conv2d_patches_nhwc: ld is ", ld, "; expected a multiple of ",
           kPatchChunk);
  GW_CHECK(!ones || ld > g.c * g.r * g.s, "conv2d_patches_nhwc: a column of ones needs ld > ",
           "C·R·S; ld is ", ld);
  const std::int64_t count = g.n * g.out_h() * g.out_w() * ld;
  if (count == 0) return;
  auto launch = [&]<class I>() {
    auto v = [](std::int64_t a) { return static_cast<I>(a); };
    const std::int64_t chunks = count / kPatchChunk;
    patches_nhwc_kernel<S, I><<<detail::grid_for(chunks), detail::kThreads, 0, stream>>>(
        cols, x, v(chunks), v(ld), v(g.c * g.r * g.s), v(ones ? g.c * g.r * g.s : ld), v(g.c),
        v(g.h), v(g.w), v(g.s), v(g.pad),
        v(g.stride), v(g.out_h()), v(g.out_w()));
  };
  if (std::max(count, g.n * g.h * g.w * g.c) < (std::int64_t{1} << 30)) {
    launch.template operator()<int>();
  } else {
    launch.template operator()<std::int64_t>();
  }
  GW_LAUNCH_CHECK();
}
template <class S>
void conv2d_pad_filters(S* dst, const S* w, const ConvGeom& g, std::int64_t ld,
                        cudaStream_t stream) {
  const std::int64_t taps = g.c * g.r * g.s, count = g.k * ld;
  GW_CHECK(ld >= taps && count < (std::int64_t{1} << 30), "conv2d_pad_filters: expected ld >= "
           "C·R·S and K·ld below 2^30");
  if (count == 0) return;
  pad_filters_kernel<S><<<detail::grid_for(count), detail::kThreads, 0, stream>>>(
      dst, w, static_cast<int>(count), static_cast<int>(taps), static_cast<int>(ld));
  GW_LAUNCH_CHECK();
}
template void conv2d_pad_filters<float>(float*, const float*, const ConvGeom&, std::int64_t,
                                        cudaStream_t);
template void conv2d_pad_filters<bf16>(bf16*, const bf16*, const ConvGeom&, std::int64_t,
                                       cudaStream_t);
template void conv2d_patches_nhwc<float>(float*, const float*, const ConvGeom&, std::int64_t,
                                         cudaStream_t, bool);
template void conv2d_patches_nhwc<bf16>(bf16*, const bf16*, const ConvGeom&, std::int64_t,
                                        cudaStream_t, bool);
template <class S>
void conv2d_split_patch_grads(S* dw, bool accumulate_w, S* db, bool accumulate_b, const S* g,
                              const ConvGeom& geom, std::int64_t ld, cudaStream_t stream) {
  const std::int64_t taps = geom.c * geom.r * geom.s, count = geom.k * (taps + 1);
  GW_CHECK(ld > taps && geom.k * ld < (std::int64_t{1} << 30), "conv2d_split_patch_grads: ",
           "expected ld > C·R·S and K·ld below 2^30");
  if (count == 0) return;
  split_patch_grads_kernel<S><<<detail::grid_for(count), detail::kThreads, 0, stream>>>(
      dw, accumulate_w, db, accumulate_b, g, static_cast<int>(count), static_cast<int>(taps),
      static_cast<int>(ld));
  GW_LAUNCH_CHECK();
}
template void conv2d_split_patch_grads<float>(float*, bool, float*, bool, const float*,
                                              const ConvGeom&, std::int64_t, cudaStream_t);
template void conv2d_split_patch_grads<bf16>(bf16*, bool, bf16*, bool, const bf16*,
                                             const ConvGeom&, std::int64_t, cudaStream_t);

bool pool2d_tiled_nhwc_fits(const PoolGeom& g) {
  return g.nhwc && g.window == 2 && g.stride == 2 && g.pad == 0 && g.h % 2 == 0 &&
         g.w % 2 == 0 && g.n * g.c * g.h * g.w < (std::int64_t{1} << 30);
}

template <class S>
void pool2d_forward_tiled_nhwc(PoolMode mode, S* y, const S* x, const PoolGeom& g,
                               cudaStream_t stream) {
  GW_CHECK(pool2d_tiled_nhwc_fits(g), "pool2d_forward_tiled_nhwc: expected channels-last 2x2 "
           "windows of stride 2, no padding, tiling an image below 2^30 elements");
  const std::int64_t outputs = g.n * g.out_h() * g.out_w() * g.c;
  if (outputs == 0) return;
  auto i32 = [](std::int64_t v) { return static_cast<int>(v); };
  if (mode == PoolMode::kMax) {
    pool_forward_tiled_nhwc_kernel<PoolMode::kMax, S>
        <<<detail::grid_for(outputs), detail::kThreads, 0, stream>>>(
            y, x, i32(outputs), i32(g.c), i32(g.h), i32(g.w), i32(g.out_h()), i32(g.out_w()));
  } else {
    pool_forward_tiled_nhwc_kernel<PoolMode::kAverage, S>
        <<<detail::grid_for(outputs), detail::kThreads, 0, stream>>>(
            y, x, i32(outputs), i32(g.c), i32(g.h), i32(g.w), i32(g.out_h()), i32(g.out_w()));
  }
  GW_LAUNCH_CHECK();
}
template void pool2d_forward_tiled_nhwc<float>(PoolMode, float*, const float*, const PoolGeom&,
                                               cudaStream_t);
template void pool2d_forward_tiled_nhwc<bf16>(PoolMode, bf16*, const bf16*, const PoolGeom&,
                                              cudaStream_t);

}  // namespace graphward::kernels
