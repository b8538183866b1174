// Elementwise kernels: one thread per element in a grid-stride loop, float32 arithmetic on float32
// or bfloat16 storage (kernels/storage.cuh). Contract in elementwise.h.
#include "kernels/elementwise.h"
#include "kernels/launch.cuh"
#include "kernels/storage.cuh"

#include <cstdint>
#include <type_traits>

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::all_16_byte_aligned;
using detail::kThreads;

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
using detail::load;
using detail::put;

template <class T>
__global__ void fill_kernel(T* y, float value, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    put(y, i, value);
  }
}

// ReLU and its derivative: exact (each result is an input or zero), so the float4 paths below
// give the bits of the one-at-a-time path. A float32 ReLU is bound by the memory's bandwidth: on
// 16-byte aligned arrays it reads and writes four elements at a time, the last few one at a time
// (grid_for_float4 sizes the grid for that).
__device__ __forceinline__ float relu_of(float v) {
  return v > 0.f || isnan(v) ? v : 0.f;  // NaN stays NaN (elementwise.h)
}
__device__ __forceinline__ float relu_grad(float dy, float y) { return y > 0.f ? dy : 0.f; }
template <class T>
__global__ void relu_forward_kernel(T* y, const T* x, std::int64_t n) {
  std::int64_t first = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (all_16_byte_aligned(y, x)) {
      const std::int64_t n4 = n / 4;
      GW_GRID_STRIDE(i, n4) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        reinterpret_cast<float4*>(y)[i] =
            make_float4(relu_of(v.x), relu_of(v.y), relu_of(v.z), relu_of(v.w));
      }
      first = n4 * 4;
    }
  }
  GW_GRID_STRIDE(j, n - first) {
    const std::int64_t i = first + j;
    put(y, i, relu_of(load(x, i)));
  }
}
template <class T>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, std::int64_t n,
                                     bool accumulate) {
  std::int64_t first = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (all_16_byte_aligned(dx, dy, y)) {
      const std::int64_t n4 = n / 4;
      GW_GRID_STRIDE(i, n4) {
        const float4 v = reinterpret_cast<const float4*>(y)[i];
        const float4 g = reinterpret_cast<const float4*>(dy)[i];
        float4 out = make_float4(relu_grad(g.x, v.x), relu_grad(g.y, v.y), relu_grad(g.z, v.z),
                                 relu_grad(g.w, v.w));
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
    put(dx, i, relu_grad(load(dy, i), load(y, i)), accumulate);
  }
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
  // GELU's derivative at v: one expression for both paths below.
  auto derivative = [](float v) {
    const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v);
  };
  // float32 arrays that are all 16-byte aligned: four elements a load (a linear layer's
  // pre-activation gradient is bound by the memory's bandwidth), the last few one at a time. The
  // product is rounded on its own (__fmul_rn) in both paths: contracted into an FMA with the
  // accumulated value in one path and not the other, the bits would depend on alignment.
  std::int64_t first = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (all_16_byte_aligned(dx, dy, x)) {
      const std::int64_t n4 = n / 4;
      GW_GRID_STRIDE(i, n4) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        const float4 g = reinterpret_cast<const float4*>(dy)[i];
        float4 out = make_float4(__fmul_rn(g.x, derivative(v.x)), __fmul_rn(g.y, derivative(v.y)),
                                 __fmul_rn(g.z, derivative(v.z)), __fmul_rn(g.w, derivative(v.w)));
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
    put(dx, i, __fmul_rn(load(dy, i), derivative(load(x, i))), accumulate);
  }
}

__global__ void narrow_backward_kernel(float* dx, const float* dy, std::int64_t rows,
                                       std::int64_t cols, std::int64_t start, std::int64_t len,
                                       bool accumulate) {
  GW_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols, j = i % cols;
    const bool inside = j >= start && j < start + len;
    if (accumulate) {
      if (inside) dx[i] += dy[r * len + (j - start)];
    } else {
      dx[i] = inside ? dy[r * len + (j - start)] : 0.f;
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

void narrow_backward(float* dx, const float* dy, std::int64_t rows, std::int64_t cols,
                     std::int64_t start, std::int64_t len, bool accumulate, cudaStream_t stream) {
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
                                cudaStream_t);
GW_INSTANTIATE(float)
GW_INSTANTIATE(bf16)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels
