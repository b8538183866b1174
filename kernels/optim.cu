// Optimizer kernels. Contract in optim.h.
#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/optim.h"

namespace graphward::kernels {
namespace {
using detail::grid_for;
using detail::kThreads;

struct SgdF {
  float momentum, dampening, weight_decay;
  bool nesterov;
};
struct AdamWF {
  float beta1, beta2, eps, weight_decay;
};

__global__ void sgd_step_kernel(float* p, const float* grad, float* buf, std::int64_t n,
                                const float* lr_ptr, const float* step_ptr, SgdF hp) {
  const float lr = *lr_ptr;
  const bool first = *step_ptr == 0.f;
  GW_GRID_STRIDE(i, n) {
    float g = grad[i];
    if (hp.weight_decay != 0.f) g += hp.weight_decay * p[i];
    if (hp.momentum != 0.f) {
      const float b = first ? g : hp.momentum * buf[i] + (1.f - hp.dampening) * g;
      buf[i] = b;
      g = hp.nesterov ? g + hp.momentum * b : b;
    }
    p[i] -= lr * g;
  }
}

__global__ void adamw_step_kernel(float* p, const float* grad, float* m, float* v, std::int64_t n,
                                  const float* lr_ptr, const float* step_ptr, AdamWF hp) {
  const float lr = *lr_ptr;
  const double t = static_cast<double>(*step_ptr) + 1.0;
  const float c1 = static_cast<float>(1.0 - pow(static_cast<double>(hp.beta1), t));
  const float c2 = static_cast<float>(1.0 - pow(static_cast<double>(hp.beta2), t));
  const float sqrt_c2 = sqrtf(c2);
  GW_GRID_STRIDE(i, n) {
    const float g = grad[i];
    float w = p[i] * (1.f - lr * hp.weight_decay);
    const float mi = hp.beta1 * m[i] + (1.f - hp.beta1) * g;
    const float vi = hp.beta2 * v[i] + (1.f - hp.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    w -= lr * (mi / c1) / (sqrtf(vi) / sqrt_c2 + hp.eps);
    p[i] = w;
  }
}

__global__ void increment_kernel(float* counter) {
  counter[0] += 1.f;
}

constexpr int kReduceThreads = 1024;

__global__ void sum_squares_kernel(float* out, const float* x, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += double(x[i]) * double(x[i]);
  acc = detail::block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc);
}

__global__ void clip_coefficient_kernel(float* norm, float* scale, const float* parts,
                                        std::int64_t count, float max_norm) {
  double total = 0;
  for (std::int64_t i = 0; i < count; ++i) total += parts[i];
  const double nrm = sqrt(total);
  norm[0] = static_cast<float>(nrm);
  const double s = static_cast<double>(max_norm) / (nrm + 1e-6);
  scale[0] = static_cast<float>(s < 1.0 ? s : 1.0);
}

__global__ void scale_by_kernel(float* x, const float* scale, std::int64_t n) {
  const float s = *scale;
  GW_GRID_STRIDE(i, n) {
    x[i] *= s;
  }
}

}  // namespace

void sgd_step(float* p, const float* grad, float* buf, std::int64_t n, const float* lr,
              const float* step, SgdParams hp, cudaStream_t stream) {
  const SgdF f{static_cast<float>(hp.momentum), static_cast<float>(hp.dampening),
               static_cast<float>(hp.weight_decay), hp.nesterov};
  sgd_step_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, grad, buf, n, lr, step, f);
  GW_LAUNCH_CHECK();
}
void adamw_step(float* p, const float* grad, float* m, float* v, std::int64_t n, const float* lr,
                const float* step, AdamWParams hp, cudaStream_t stream) {
  const AdamWF f{static_cast<float>(hp.beta1), static_cast<float>(hp.beta2),
                 static_cast<float>(hp.eps), static_cast<float>(hp.weight_decay)};
  adamw_step_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, grad, m, v, n, lr, step, f);
  GW_LAUNCH_CHECK();
}
void increment(float* counter, cudaStream_t stream) {
  increment_kernel<<<1, 1, 0, stream>>>(counter);
  GW_LAUNCH_CHECK();
}
void sum_squares(float* out, const float* x, std::int64_t n, cudaStream_t stream) {
  sum_squares_kernel<<<1, kReduceThreads, 0, stream>>>(out, x, n);
  GW_LAUNCH_CHECK();
}
void clip_coefficient(float* norm, float* scale, const float* parts, std::int64_t count,
                      float max_norm, cudaStream_t stream) {
  clip_coefficient_kernel<<<1, 1, 0, stream>>>(norm, scale, parts, count, max_norm);
  GW_LAUNCH_CHECK();
}
void scale_by(float* x, const float* scale, std::int64_t n, cudaStream_t stream) {
  scale_by_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, scale, n);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
