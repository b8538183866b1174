#pragma once
// Optimizer updates and gradient clipping, with CPU references. Same launcher contract as
// elementwise.h (never allocate, never synchronize, safe to capture). The learning rate and the
// step count are read from device memory (lr[0]; step[0], the number of steps taken before this
// one), so that a captured optimizer step sees a changed learning rate and counts its own steps
// when replayed. Semantics follow torch.optim.SGD and torch.optim.AdamW.
#include <cstdint>

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

// Hyperparameters in double (the CPU reference computes in the parameters' type; CUDA kernels
// in float).
struct SgdParams {
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
struct AdamWParams {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};

#if GRAPHWARD_HAS_CUDA
// g = grad + wd·p; with momentum: buf = (step == 0 ? g : momentum·buf + (1 − dampening)·g),
// g = nesterov ? g + momentum·buf : buf; then p −= lr·g. buf may be null without momentum.
void sgd_step(float* p, const float* grad, float* buf, std::int64_t n, const float* lr,
              const float* step, SgdParams hp, cudaStream_t stream);
// t = step + 1; p ·= 1 − lr·wd; m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²;
// p −= lr · (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)
void adamw_step(float* p, const float* grad, float* m, float* v, std::int64_t n, const float* lr,
                const float* step, AdamWParams hp, cudaStream_t stream);
// counter[0] += 1
void increment(float* counter, cudaStream_t stream);
// out[0] = Σ x[i]² (accumulated in double, fixed order: deterministic)
void sum_squares(float* out, const float* x, std::int64_t n, cudaStream_t stream);
// norm[0] = √(Σ parts[i]) over `count` parts (in order); scale[0] = min(1, max_norm / (norm + 1e-6))
void clip_coefficient(float* norm, float* scale, const float* parts, std::int64_t count,
                      float max_norm, cudaStream_t stream);
// x[i] ·= scale[0]
void scale_by(float* x, const float* scale, std::int64_t n, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void sgd_step(T* p, const T* grad, T* buf, std::int64_t n, T lr, T step, SgdParams hp);
template <class T>
void adamw_step(T* p, const T* grad, T* m, T* v, std::int64_t n, T lr, T step, AdamWParams hp);
template <class T>
T sum_squares(const T* x, std::int64_t n);
}  // namespace cpu

}  // namespace graphward::kernels
