// Elementwise kernels: one thread per element in a grid-stride loop, float32 arithmetic on float32
// or bfloat16 storage (kernels/storage.cuh). Contract in elementwise.h.
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/storage.cuh"

#include <cstdint>
#include <type_traits>

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::all_16_byte_aligned;
using detail::kThreads;
using detail::load;
using detail::put;

// The grid of a kernel: where it has a float4 path (`has_float4`: relu, gelu backward) and takes
// it (T is float32 and every pointer is 16-byte aligned), a thread for every four elements and
// for each of the last few; grid_for(n) otherwise.
template <class T, class... P>
unsigned grid_for_float4(bool has_float4, std::int64_t n, const P*... p) {
  if constexpr (std::is_same_v<T, float>) {
    if (has_float4 && all_16_byte_aligned(p...)) return grid_for(n / 4 + n % 4);
  }
  return grid_for(n);
}

// The float4 paths, in the calling kernel's grid-stride loops: y[i] = f(x[i]) (map_forward) and
// dx[i] (=|+=) f(dy[i], s[i]) (map_backward) over n elements. float32 arrays that are all 16-byte
// aligned go four elements a load (an activation is bound by the memory's bandwidth), the last few
// one at a time; bfloat16, or any array misaligned, one at a time. f is the one expression of both
// paths, so the bits do not depend on alignment (where f multiplies, it rounds the product on its
// own, __fmul_rn: contracted into an FMA with the accumulated value in one path and not the other,
// the bits would differ).
template <class T, class F>
__device__ __forceinline__ void map_forward(T* y, const T* x, std::int64_t n, F f) {
  std::int64_t first = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (all_16_byte_aligned(y, x)) {
      const std::int64_t n4 = n / 4;
      GW_GRID_STRIDE(i, n4) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<float4*>(y)[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
      }
      first = n4 * 4;
    }
  }
  GW_GRID_STRIDE(j, n - first) {
    const std::int64_t i = first + j;
    put(y, i, f(load(x, i)));
  }
}
template <class T, class F>
__device__ __forceinline__ void map_backward(T* dx, const T* dy, const T* s, std::int64_t n,
                                             bool accumulate, F f) {
  std::int64_t first = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (all_16_byte_aligned(dx, dy, s)) {
      const std::int64_t n4 = n / 4;
      GW_GRID_STRIDE(i, n4) {
        const float4 v = reinterpret_cast<const float4*>(s)[i];
        const float4 g = reinterpret_cast<const float4*>(dy)[i];
        float4 out = make_float4(f(g.x, v.x), f(g.y, v.y), f(g.z, v.z), f(g.w, v.w));
        if (accumulate) {
          const float4 old = reinterpret_cast<const float4*>(dx)[i];
          out = make_float4(old.x + out.x, old.y + out.y, old.z + out.z, old.w + out.w);
        }
        reinterpret_cast<float4*>(dx)[i] = out;
      }
      first = n4 * 4;
    }
  }
  GW_GRID_STRIDE(j, n - first) {
    const std::int64_t i = first + j;
    put(dx, i, f(load(dy, i), load(s, i)), accumulate);
  }
}

template <class T>
__global__ void fill_kernel(T* y, float value, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    put(y, i, value);
  }
}

// ReLU and its derivative: exact (each result is an input or zero).
template <class T>
__global__ void relu_forward_kernel(T* y, const T* x, std::int64_t n) {
  map_forward(y, x, n, [](float v) {
    return v > 0.f || isnan(v) ? v : 0.f;  // NaN stays NaN (elementwise.h)
  });
}
template <class T>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, std::int64_t n,
                                     bool accumulate) {
  map_backward(dx, dy, y, n, accumulate, [](float g, float v) { return v > 0.f ? g : 0.f; });
}
template <class T>
__global__ void tanh_forward_kernel(T* y, const T* x, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    put(y, i, tanhf(load(x, i)));
  }
}
template <class T>
__global__ void tanh_backward_kernel(T* dx, const T* dy, const T* y, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    const float yv = load(y, i);
    put(dx, i, load(dy, i) * (1.f - yv * yv), accumulate);
  }
}
template <class T>
__global__ void sigmoid_forward_kernel(T* y, const T* x, std::int64_t n) {
  // expf of a large negative argument is 0, of a large positive one inf: 1/(1+inf) = 0. No NaN.
  GW_GRID_STRIDE(i, n) {
    put(y, i, 1.f / (1.f + expf(-load(x, i))));
  }
}
template <class T>
__global__ void sigmoid_backward_kernel(T* dx, const T* dy, const T* y, std::int64_t n,
                                        bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    const float yv = load(y, i);
    put(dx, i, load(dy, i) * yv * (1.f - yv), accumulate);
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
template <class T>
__global__ void gelu_forward_kernel(T* y, const T* x, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    const float v = load(x, i);
    put(y, i, 0.5f * v * (1.f + tanhf(kGeluC * (v + kGeluA * v * v * v))));
  }
}
template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* dy, const T* x, std::int64_t n,
                                     bool accumulate) {
  map_backward(dx, dy, x, n, accumulate, [](float g, float v) {
    const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    return __fmul_rn(
        g, 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v));
  });
}

template <class T>
__global__ void narrow_backward_kernel(T* dx, const T* dy, std::int64_t rows, std::int64_t cols,
                                       std::int64_t start, std::int64_t len, bool accumulate) {
  GW_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols, j = i % cols;
    const bool inside = j >= start && j < start + len;
    if (accumulate) {
      if (inside) detail::put(dx, i, detail::load(dy, r * len + (j - start)), true);
    } else {
      detail::put(dx, i, inside ? detail::load(dy, r * len + (j - start)) : 0.f);
    }
  }
}

template <BinaryOp op, class T>
__global__ void binary_forward_kernel(T* y, const T* a, std::int64_t a_period, const T* b,
                                      std::int64_t b_period, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    const float av = load(a, a_period == n ? i : i % a_period);
    const float bv = load(b, b_period == n ? i : i % b_period);
    if constexpr (op == BinaryOp::kAdd) put(y, i, av + bv);
    if constexpr (op == BinaryOp::kSub) put(y, i, av - bv);
    if constexpr (op == BinaryOp::kMul) put(y, i, av * bv);
  }
}
template <class T>
__global__ void affine_forward_kernel(T* y, const T* x, float alpha, float beta, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    put(y, i, alpha * load(x, i) + beta);
  }
}
template <class T>
__global__ void scale_backward_kernel(T* dx, const T* dy, float alpha, std::int64_t n,
                                      bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    put(dx, i, alpha * load(dy, i), accumulate);
  }
}
template <class T>
__global__ void mul_backward_kernel(T* dx, const T* dy, const T* other, std::int64_t other_period,
                                    std::int64_t n, bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    put(dx, i, load(dy, i) * load(other, other_period == n ? i : i % other_period), accumulate);
  }
}

}  // namespace

template <class T>
void fill(T* y, float value, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, value, n);
  GW_LAUNCH_CHECK();
}

// The grids are sized for the float4 paths where the kernel has one and takes it
// (grid_for_float4); a grid-stride loop is correct for any grid.
#define GW_UNARY_LAUNCHERS(name, forward_float4, backward_float4)                                 \
  template <class T>                                                                             \
  void name##_forward(T* y, const T* x, std::int64_t n, cudaStream_t stream) {                   \
    const unsigned grid = grid_for_float4<T>(forward_float4, n, y, x);                           \
    name##_forward_kernel<<<grid, kThreads, 0, stream>>>(y, x, n);                               \
    GW_LAUNCH_CHECK();                                                                           \
  }                                                                                              \
  template <class T>                                                                             \
  void name##_backward(T* dx, const T* dy, const T* saved, std::int64_t n, bool accumulate,      \
                       cudaStream_t stream) {                                                    \
    const unsigned grid = grid_for_float4<T>(backward_float4, n, dx, dy, saved);                 \
    name##_backward_kernel<<<grid, kThreads, 0, stream>>>(dx, dy, saved, n, accumulate);         \
    GW_LAUNCH_CHECK();                                                                           \
  }
GW_UNARY_LAUNCHERS(relu, true, true)
GW_UNARY_LAUNCHERS(tanh, false, false)
GW_UNARY_LAUNCHERS(sigmoid, false, false)
GW_UNARY_LAUNCHERS(gelu, false, true)
#undef GW_UNARY_LAUNCHERS

template <class T>
void narrow_backward(T* dx, const T* dy, std::int64_t rows, std::int64_t cols, std::int64_t start,
                     std::int64_t len, bool accumulate, cudaStream_t stream) {
  narrow_backward_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(dx, dy, rows, cols, start,
                                                                         len, accumulate);
  GW_LAUNCH_CHECK();
}

template <class T>
void binary_forward(BinaryOp op, T* y, const T* a, std::int64_t a_period, const T* b,
                    std::int64_t b_period, std::int64_t n, cudaStream_t stream) {
  switch (op) {
    case BinaryOp::kAdd:
      binary_forward_kernel<BinaryOp::kAdd>
          <<<grid_for(n), kThreads, 0, stream>>>(y, a, a_period, b, b_period, n);
      break;
    case BinaryOp::kSub:
      binary_forward_kernel<BinaryOp::kSub>
          <<<grid_for(n), kThreads, 0, stream>>>(y, a, a_period, b, b_period, n);
      break;
    case BinaryOp::kMul:
      binary_forward_kernel<BinaryOp::kMul>
          <<<grid_for(n), kThreads, 0, stream>>>(y, a, a_period, b, b_period, n);
      break;
  }
  GW_LAUNCH_CHECK();
}
template <class T>
void affine_forward(T* y, const T* x, float alpha, float beta, std::int64_t n,
                    cudaStream_t stream) {
  affine_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, alpha, beta, n);
  GW_LAUNCH_CHECK();
}
template <class T>
void scale_backward(T* dx, const T* dy, float alpha, std::int64_t n, bool accumulate,
                    cudaStream_t stream) {
  scale_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, alpha, n, accumulate);
  GW_LAUNCH_CHECK();
}
template <class T>
void mul_backward(T* dx, const T* dy, const T* other, std::int64_t other_period, std::int64_t n,
                  bool accumulate, cudaStream_t stream) {
  mul_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, other, other_period, n,
                                                            accumulate);
  GW_LAUNCH_CHECK();
}

// The public launchers, for float32 and bfloat16 storage.
#define GW_INSTANTIATE(T)                                                                        \
  template void fill<T>(T*, float, std::int64_t, cudaStream_t);                                  \
  template void relu_forward<T>(T*, const T*, std::int64_t, cudaStream_t);                       \
  template void relu_backward<T>(T*, const T*, const T*, std::int64_t, bool, cudaStream_t);      \
  template void tanh_forward<T>(T*, const T*, std::int64_t, cudaStream_t);                       \
  template void tanh_backward<T>(T*, const T*, const T*, std::int64_t, bool, cudaStream_t);      \
  template void sigmoid_forward<T>(T*, const T*, std::int64_t, cudaStream_t);                    \
  template void sigmoid_backward<T>(T*, const T*, const T*, std::int64_t, bool, cudaStream_t);   \
  template void gelu_forward<T>(T*, const T*, std::int64_t, cudaStream_t);                       \
  template void gelu_backward<T>(T*, const T*, const T*, std::int64_t, bool, cudaStream_t);      \
  template void binary_forward<T>(BinaryOp, T*, const T*, std::int64_t, const T*, std::int64_t,  \
                                  std::int64_t, cudaStream_t);                                   \
  template void affine_forward<T>(T*, const T*, float, float, std::int64_t, cudaStream_t);       \
  template void scale_backward<T>(T*, const T*, float, std::int64_t, bool, cudaStream_t);        \
  template void mul_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, bool,        \
                                cudaStream_t);                                                   \
  template void narrow_backward<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,       \
                                   std::int64_t, bool, cudaStream_t);
GW_INSTANTIATE(float)
GW_INSTANTIATE(bf16)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels
