// Elementwise kernels: one thread per element in a grid-stride loop. Contract in elementwise.h.
#include "kernels/elementwise.h"
#include "kernels/launch.cuh"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;
using detail::store;

__global__ void fill_kernel(float* y, float value, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    y[i] = value;
  }
}

__global__ void relu_forward_kernel(float* y, const float* x, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    y[i] = x[i] > 0.f ? x[i] : 0.f;
  }
}
__global__ void relu_backward_kernel(float* dx, const float* dy, const float* y, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(dx, i, y[i] > 0.f ? dy[i] : 0.f, accumulate);
  }
}
__global__ void tanh_forward_kernel(float* y, const float* x, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    y[i] = tanhf(x[i]);
  }
}
__global__ void tanh_backward_kernel(float* dx, const float* dy, const float* y, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(dx, i, dy[i] * (1.f - y[i] * y[i]), accumulate);
  }
}
__global__ void sigmoid_forward_kernel(float* y, const float* x, std::int64_t n) {
  // expf of a large negative argument is 0, of a large positive one inf: 1/(1+inf) = 0. No NaN.
  GW_GRID_STRIDE(i, n) {
    y[i] = 1.f / (1.f + expf(-x[i]));
  }
}
__global__ void sigmoid_backward_kernel(float* dx, const float* dy, const float* y, std::int64_t n,
                                        bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(dx, i, dy[i] * y[i] * (1.f - y[i]), accumulate);
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
__global__ void gelu_forward_kernel(float* y, const float* x, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
  }
}
__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, std::int64_t n,
                                     bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * v * v);
    store(dx, i, dy[i] * d, accumulate);
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

template <BinaryOp op>
__global__ void binary_forward_kernel(float* y, const float* a, std::int64_t a_period,
                                      const float* b, std::int64_t b_period, std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    const float av = a[a_period == n ? i : i % a_period];
    const float bv = b[b_period == n ? i : i % b_period];
    if constexpr (op == BinaryOp::kAdd) y[i] = av + bv;
    if constexpr (op == BinaryOp::kSub) y[i] = av - bv;
    if constexpr (op == BinaryOp::kMul) y[i] = av * bv;
  }
}
__global__ void affine_forward_kernel(float* y, const float* x, float alpha, float beta,
                                      std::int64_t n) {
  GW_GRID_STRIDE(i, n) {
    y[i] = alpha * x[i] + beta;
  }
}
__global__ void scale_backward_kernel(float* dx, const float* dy, float alpha, std::int64_t n,
                                      bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(dx, i, alpha * dy[i], accumulate);
  }
}
__global__ void mul_backward_kernel(float* dx, const float* dy, const float* other,
                                    std::int64_t other_period, std::int64_t n, bool accumulate) {
  GW_GRID_STRIDE(i, n) {
    store(dx, i, dy[i] * other[other_period == n ? i : i % other_period], accumulate);
  }
}

}  // namespace

void fill(float* y, float value, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, value, n);
  GW_LAUNCH_CHECK();
}

void relu_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream) {
  relu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  GW_LAUNCH_CHECK();
}
void relu_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream) {
  relu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, y, n, accumulate);
  GW_LAUNCH_CHECK();
}
void tanh_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream) {
  tanh_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  GW_LAUNCH_CHECK();
}
void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                   cudaStream_t stream) {
  tanh_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, y, n, accumulate);
  GW_LAUNCH_CHECK();
}
void sigmoid_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream) {
  sigmoid_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  GW_LAUNCH_CHECK();
}
void sigmoid_backward(float* dx, const float* dy, const float* y, std::int64_t n, bool accumulate,
                      cudaStream_t stream) {
  sigmoid_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, y, n, accumulate);
  GW_LAUNCH_CHECK();
}

void gelu_forward(float* y, const float* x, std::int64_t n, cudaStream_t stream) {
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  GW_LAUNCH_CHECK();
}
void gelu_backward(float* dx, const float* dy, const float* x, std::int64_t n, bool accumulate,
                   cudaStream_t stream) {
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, x, n, accumulate);
  GW_LAUNCH_CHECK();
}

void narrow_backward(float* dx, const float* dy, std::int64_t rows, std::int64_t cols,
                     std::int64_t start, std::int64_t len, bool accumulate, cudaStream_t stream) {
  narrow_backward_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(dx, dy, rows, cols, start,
                                                                         len, accumulate);
  GW_LAUNCH_CHECK();
}

void binary_forward(BinaryOp op, float* y, const float* a, std::int64_t a_period, const float* b,
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
void affine_forward(float* y, const float* x, float alpha, float beta, std::int64_t n,
                    cudaStream_t stream) {
  affine_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, alpha, beta, n);
  GW_LAUNCH_CHECK();
}
void scale_backward(float* dx, const float* dy, float alpha, std::int64_t n, bool accumulate,
                    cudaStream_t stream) {
  scale_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, alpha, n, accumulate);
  GW_LAUNCH_CHECK();
}
void mul_backward(float* dx, const float* dy, const float* other, std::int64_t other_period,
                  std::int64_t n, bool accumulate, cudaStream_t stream) {
  mul_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, other, other_period, n,
                                                            accumulate);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
