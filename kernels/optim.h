#pragma once
// Optimizer updates and gradient clipping, with CPU references. Same launcher contract as
// elementwise.h (never allocate, never synchronize, safe to capture). The learning rate and each
// parameter's step count are read from device memory (lr[0]; *slice.step, the number of steps
// that parameter took before this one), so that a captured optimizer step sees a changed learning
// rate and counts its own steps when replayed. Semantics follow torch.optim.SGD and
// torch.optim.AdamW, whose step counts are per parameter too.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if defined(__CUDACC__)
#define GW_OPTIM_HD __host__ __device__
#else
#define GW_OPTIM_HD
#endif

// Note [Learning-rate schedule]
// A step's learning rate may follow llm.c's and nanoGPT's schedule, computed where the step runs
// from the learning rate held on the device (the peak; set_lr writes it) and the parameter's own
// step count t (the steps it took before this one): a linear warm-up, peak · (t + 1) / warmup
// while t < warmup, then a cosine decay to final_fraction · peak at t = total, held there after.
// A captured step replayed computes each replay's rate from the counts the replays advance:
// nothing is read back or written from the host. total = 0: no schedule, the rate is the peak.
struct LrSchedule {
  double warmup = 0, total = 0, final_fraction = 0;
};
GW_OPTIM_HD inline double scheduled_lr(double peak, double t, const LrSchedule& s) {
  if (s.total <= 0) return peak;
  if (t < s.warmup) return peak * (t + 1.0) / s.warmup;
  double r = (t - s.warmup) / (s.total - s.warmup);
  if (r > 1.0) r = 1.0;
  const double low = peak * s.final_fraction;
  return low + 0.5 * (1.0 + cos(3.141592653589793 * r)) * (peak - low);
}

// Hyperparameters in double (the CPU reference computes in the parameters' type; CUDA kernels
// in float).
struct SgdParams {
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  LrSchedule schedule;
};
struct AdamWParams {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  LrSchedule schedule;
};

// One parameter of a multi-tensor step: the parameter, its gradient, up to two state tensors of
// its size (SGD: the momentum buffer, or null without momentum; AdamW: m and v) and its step
// count (a double, exact to 2^53, counted by the step). A bfloat16 parameter is updated through
// its float32 master copy: p is the master, the gradient is read from grad16 (bfloat16; grad is
// null), and the parameter itself (`copy`) is written as the updated master rounded to nearest
// even, in the same pass.
struct ParamSlice {
  float* p = nullptr;
  const float* grad = nullptr;
  float* s1 = nullptr;
  float* s2 = nullptr;
  double* step = nullptr;
  const bf16* grad16 = nullptr;
  bf16* copy = nullptr;
  std::int64_t n = 0;
  float weight_decay = 0.f;  // the parameter's own (its group's): the hyperparameters' is unused
};
// Parameters one launch takes: the kernel's parameter block (a slice, its first block) stays under
// the 4 KiB that every architecture passes.
constexpr std::size_t kMultiTensorMax = 48;

#if GRAPHWARD_HAS_CUDA
// Note [Multi-tensor step]
// An optimizer step updates every parameter in ceil(count / kMultiTensorMax) launches, not one a
// parameter: each parameter gets its own range of blocks, and each element is computed by the same
// arithmetic whatever the grouping (a parameter's result does not depend on the others) and
// whatever its alignment (AdamW reads four elements a load where a parameter's arrays are 16-byte
// aligned, one otherwise; every product and sum is rounded on its own, so both give the same
// bits). The step counts need no launch of their own either: each block reads its parameter's
// count, does its work and counts itself done in done[0]; the block of a launch that counts last
// adds 1 to the count of every parameter of the launch (every other block has read them by then)
// and resets done[0] to 0 for the next launch. Only the parameters updated are counted: a
// parameter without a gradient keeps its count, as in PyTorch, so a layer unfrozen late starts at
// step 1.
//
// wd: each slice's weight_decay (the parameter's group's); the hyperparameters' weight_decay is
// what the CPU references read.
// lr: the peak; each parameter's rate is scheduled_lr(lr[0], its count, hp.schedule).
// Per parameter, SGD: g = grad + wd·p; with momentum: buf = (step == 0 ? g : momentum·buf +
// (1 − dampening)·g), g = nesterov ? g + momentum·buf : buf; then p −= lr·g.
void sgd_step(const ParamSlice* params, std::size_t count, const float* lr, unsigned* done,
              SgdParams hp, cudaStream_t stream);
// Per parameter, AdamW: t = step + 1; p ·= 1 − lr·wd; m = β1·m + (1 − β1)·g;
// v = β2·v + (1 − β2)·g²; p −= lr · (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)
void adamw_step(const ParamSlice* params, std::size_t count, const float* lr, unsigned* done,
                AdamWParams hp, cudaStream_t stream);
// How many partial sums sum_squares writes for n elements: the blocks of its grid, enough to keep
// the GPU's memory busy (one block a large gradient's tens of millions of elements took ~40 ms on
// an H100), one for a small tensor.
std::int64_t sum_squares_parts(std::int64_t n);
// out[b] = Σ x[i]² over the elements block b takes (i = (b + k·parts)·1024 + thread), for
// b < sum_squares_parts(n): each accumulated in double in a fixed order and tree, so the parts and
// their sum are deterministic. S: float or bf16.
template <class S>
void sum_squares(float* out, const S* x, std::int64_t n, cudaStream_t stream);
// norm[0] = √(Σ parts[i]) over `count` parts (in double, one block in a fixed order and tree);
// scale[0] = min(1, max_norm / (norm + 1e-6)), NaN when the norm is
// (torch.nn.utils.clip_grad_norm_: every gradient becomes NaN)
void clip_coefficient(float* norm, float* scale, const float* parts, std::int64_t count,
                      float max_norm, cudaStream_t stream);
// x[i] ·= scale[0] (bfloat16: the product rounded once)
template <class S>
void scale_by(S* x, const float* scale, std::int64_t n, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void sgd_step(T* p, const T* grad, T* buf, std::int64_t n, T lr, double step, SgdParams hp);
template <class T>
void adamw_step(T* p, const T* grad, T* m, T* v, std::int64_t n, T lr, double step, AdamWParams hp);
template <class T>
T sum_squares(const T* x, std::int64_t n);
}  // namespace cpu

}  // namespace graphward::kernels
