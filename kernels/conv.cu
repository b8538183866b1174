// The convolution's bias gradient (the rest of convolution and pooling is cuDNN's, runtime/dnn.h):
// db[k] (=|+=) Σ_n Σ_hw dy[n, k, hw] — deterministic, in one or two passes; the bias and ReLU
// of a conv2d_relu in one pass after the convolution; and pooling's backward through the ReLU
// before it.
#include <algorithm>

#include "kernels/block_reduce.cuh"
#include "kernels/conv.h"
#include "kernels/launch.cuh"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::store;

constexpr int kBiasThreads = 256;
constexpr std::int64_t kTargetBlocks = 264;  // two waves of a 132-SM GPU

// Images per slice: enough slices that channels x slices fills the GPU.
std::int64_t images_per_slice(std::int64_t n, std::int64_t k) {
  const std::int64_t slices = std::min(n, std::max<std::int64_t>(1, (kTargetBlocks + k - 1) / k));
  return (n + slices - 1) / slices;
}

// Block (channel k, slice s): the sum of dy over the slice's images for channel k (a flat loop
// over its images' planes), into partial[s, k] — or, with one slice, into db itself.
__global__ void bias_grad_partial_kernel(float* partial, float* db, const float* dy,
                                         std::int64_t n, std::int64_t k, std::int64_t plane,
                                         std::int64_t per, bool accumulate) {
  const std::int64_t ch = blockIdx.x, slice = blockIdx.y;
  const std::int64_t n0 = slice * per, n1 = n0 + per < n ? n0 + per : n;
  const std::int64_t count = (n1 - n0) * plane;
  float acc = 0.f;
  for (std::int64_t t = threadIdx.x; t < count; t += kBiasThreads) {
    const std::int64_t img = n0 + t / plane;
    acc += dy[(img * k + ch) * plane + t % plane];
  }
  acc = block_reduce<kBiasThreads>(acc);
  if (threadIdx.x == 0) {
    if (partial) {
      partial[slice * k + ch] = acc;
    } else {
      store(db, ch, acc, accumulate);
    }
  }
}

__global__ void bias_grad_sum_kernel(float* db, const float* partial, std::int64_t slices,
                                     std::int64_t k, bool accumulate) {
  GW_GRID_STRIDE(ch, k) {
    float acc = 0.f;
    for (std::int64_t s = 0; s < slices; ++s) acc += partial[s * k + ch];
    store(db, ch, acc, accumulate);
  }
}

}  // namespace

std::int64_t conv2d_bias_grad_workspace(const ConvGeom& g) {
  const std::int64_t per = images_per_slice(g.n, g.k);
  const std::int64_t slices = (g.n + per - 1) / per;
  return slices > 1 ? slices * g.k : 0;
}

namespace {
__global__ void bias_act_kernel(float* y, const float* bias, std::int64_t n, std::int64_t plane,
                                std::int64_t k, bool relu) {
  GW_GRID_STRIDE(i, n) {
    float v = y[i];
    if (bias) v = v + bias[(i / plane) % k];
    y[i] = relu ? (v > 0.f ? v : 0.f) : v;
  }
}
}  // namespace

void conv2d_bias_act(float* y, const float* bias, const ConvGeom& g, bool relu,
                     cudaStream_t stream) {
  const std::int64_t plane = g.out_h() * g.out_w();
  const std::int64_t n = g.n * g.k * plane;
  if (n == 0) return;
  bias_act_kernel<<<detail::grid_for(n), detail::kThreads, 0, stream>>>(y, bias, n, plane, g.k,
                                                                        relu);
  GW_LAUNCH_CHECK();
}

namespace {
// Thread per input element (plane p, row ih, column iw): the windows that hold it, in row-major
// order. Max: a window sends it its gradient when it is the window's first element equal to the
// maximum; average: every window sends its gradient over its area.
__device__ __forceinline__ std::int64_t imax(std::int64_t a, std::int64_t b) {
  return a > b ? a : b;
}
__device__ __forceinline__ std::int64_t imin(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}

template <PoolMode kMode>
__global__ void pool_backward_relu_kernel(float* dx, const float* dy, const float* x,
                                          const float* y, std::int64_t n, PoolGeom g,
                                          std::int64_t oh_n, std::int64_t ow_n, bool accumulate) {
  const float area = static_cast<float>(g.window * g.window);
  GW_GRID_STRIDE(i, n) {
    const std::int64_t iw = i % g.w, ih = (i / g.w) % g.h, p = i / (g.w * g.h);
    const float v = x[i];
    float acc = 0.f;
    if (v > 0.f) {
      // Windows oh with oh·stride - pad <= ih < oh·stride - pad + window (likewise ow).
      const std::int64_t oh0 = imax(0, (ih + g.pad - g.window + g.stride) / g.stride);
      const std::int64_t ow0 = imax(0, (iw + g.pad - g.window + g.stride) / g.stride);
      const std::int64_t oh1 = imin(oh_n - 1, (ih + g.pad) / g.stride);
      const std::int64_t ow1 = imin(ow_n - 1, (iw + g.pad) / g.stride);
      const float* plane = x + p * g.h * g.w;
      for (std::int64_t oh = oh0; oh <= oh1; ++oh) {
        for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
          const std::int64_t o = (p * oh_n + oh) * ow_n + ow;
          if constexpr (kMode == PoolMode::kAverage) {
            acc += dy[o] / area;
          } else {
            const float m = y[o];
            // Whether no element before this one in the window (row-major, inside the image)
            // equals m.
            const std::int64_t h0 = imax(0, oh * g.stride - g.pad);
            const std::int64_t w0 = imax(0, ow * g.stride - g.pad);
            const std::int64_t w_end = imin(g.w, ow * g.stride - g.pad + g.window);
            bool first = v == m;
            for (std::int64_t h = h0; h <= ih && first; ++h) {
              for (std::int64_t w = w0; w < (h < ih ? w_end : iw); ++w) {
                if (plane[h * g.w + w] == m) {
                  first = false;
                  break;
                }
              }
            }
            if (first) acc += dy[o];
          }
        }
      }
    }
    store(dx, i, acc, accumulate);
  }
}
}  // namespace

void pool2d_backward_relu(PoolMode mode, float* dx, const float* dy, const float* x, const float* y,
                          const PoolGeom& g, bool accumulate, cudaStream_t stream) {
  const std::int64_t n = g.n * g.c * g.h * g.w;
  if (n == 0) return;
  if (mode == PoolMode::kMax) {
    pool_backward_relu_kernel<PoolMode::kMax><<<detail::grid_for(n), detail::kThreads, 0, stream>>>(
        dx, dy, x, y, n, g, g.out_h(), g.out_w(), accumulate);
  } else {
    pool_backward_relu_kernel<PoolMode::kAverage>
        <<<detail::grid_for(n), detail::kThreads, 0, stream>>>(dx, dy, x, y, n, g, g.out_h(),
                                                               g.out_w(), accumulate);
  }
  GW_LAUNCH_CHECK();
}

void conv2d_bias_grad(float* db, const float* dy, const ConvGeom& g, bool accumulate,
                      float* workspace, cudaStream_t stream) {
  const std::int64_t plane = g.out_h() * g.out_w();
  const std::int64_t per = images_per_slice(g.n, g.k);
  const std::int64_t slices = (g.n + per - 1) / per;
  const dim3 grid(static_cast<unsigned>(g.k), static_cast<unsigned>(slices));
  bias_grad_partial_kernel<<<grid, kBiasThreads, 0, stream>>>(
      slices > 1 ? workspace : nullptr, db, dy, g.n, g.k, plane, per, accumulate);
  GW_LAUNCH_CHECK();
  if (slices > 1) {
    bias_grad_sum_kernel<<<detail::grid_for(g.k), detail::kThreads, 0, stream>>>(
        db, workspace, slices, g.k, accumulate);
    GW_LAUNCH_CHECK();
  }
}

}  // namespace graphward::kernels
