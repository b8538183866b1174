// Optimizer kernels. Contract in optim.h.
#include "graphward/kernels/block_reduce.cuh"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/optim.h"
#include "graphward/kernels/storage.cuh"

#include <algorithm>
#include <cstdint>

namespace graphward::kernels {
namespace {
using detail::all_16_byte_aligned;
using detail::grid_for;
using detail::kThreads;
using detail::load;
using detail::put;

// Element i of a slice's gradient (float32, or a bfloat16 parameter's bfloat16 one).
__device__ __forceinline__ float grad_at(const ParamSlice& s, std::int64_t i) {
  return s.grad16 ? load(s.grad16, i) : s.grad[i];
}

// The hyperparameters every parameter shares (each slice carries its own weight decay).
struct SgdF {
  float momentum, dampening;
  bool nesterov;
  LrSchedule schedule;
};
struct AdamWF {
  float beta1, beta2, eps;
  LrSchedule schedule;
};

// Note [Multi-tensor step] (optim.h). A launch's parameters, in its parameter block: parameter i
// takes blocks [first_block[i], first_block[i + 1]).
struct Batch {
  ParamSlice t[kMultiTensorMax];
  unsigned first_block[kMultiTensorMax + 1];
  int count;
};
static_assert(sizeof(Batch) + 64 <= 4096, "a launch's parameters must fit in 4 KiB");
// Blocks a parameter of n elements gets: one a kThreads elements, at most kMaxBlocks (the blocks
// then stride over it).
constexpr std::int64_t kMaxBlocks = 1024;

// The slice this block updates, and the block's index and count within it.
__device__ __forceinline__ const ParamSlice& my_slice(const Batch& b, unsigned& block,
                                                      unsigned& blocks) {
  int lo = 0, hi = b.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.first_block[mid] <= blockIdx.x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  block = blockIdx.x - b.first_block[lo];
  blocks = b.first_block[lo + 1] - b.first_block[lo];
  return b.t[lo];
}

// After the block read its parameter's count and did its work: the last block of the grid counts
// the step of every parameter of the launch.
__device__ __forceinline__ void count_steps(const Batch& b, unsigned* done) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      for (int i = 0; i < b.count; ++i) *b.t[i].step += 1.0;
      *done = 0u;
    }
  }
}

#define GW_SLICE_STRIDE(i, block, blocks, n)                                              \
  for (std::int64_t i = static_cast<std::int64_t>(block) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blocks) * blockDim.x)

__global__ void sgd_step_kernel(const __grid_constant__ Batch b, const float* lr_ptr,
                                unsigned* done, SgdF hp) {
  unsigned block = 0, blocks = 0;
  const ParamSlice& t = my_slice(b, block, blocks);
  const bool first = *t.step == 0.0;
  const float lr = static_cast<float>(scheduled_lr(*lr_ptr, *t.step, hp.schedule));
  float* p = t.p;
  float* buf = t.s1;
  GW_SLICE_STRIDE(i, block, blocks, t.n) {
    float g = grad_at(t, i);
    if (t.weight_decay != 0.f) g += t.weight_decay * p[i];
    if (hp.momentum != 0.f) {
      const float m = first ? g : hp.momentum * buf[i] + (1.f - hp.dampening) * g;
      buf[i] = m;
      g = hp.nesterov ? g + hp.momentum * m : m;
    }
    p[i] -= lr * g;
    if (t.copy) put(t.copy, i, p[i]);
  }
  count_steps(b, done);
}

// One element of AdamW (optim.h), in the CPU kernel's order with every product and sum rounded on
// its own (__fmul_rn, __fadd_rn: never contracted into an FMA). Both of the kernel's paths call
// it, and contraction chosen by the compiler differed between them: a parameter's bits depended
// on its alignment. The step is bound by the memory's bandwidth; what the few more instructions
// cost the whole step is in docs/DECISIONS.md.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v,
                                              const AdamWF& hp, float wd, float lr, float c1,
                                              float sqrt_c2) {
  float w = __fmul_rn(p, __fsub_rn(1.f, __fmul_rn(lr, wd)));
  const float mi = __fadd_rn(__fmul_rn(hp.beta1, m), __fmul_rn(__fsub_rn(1.f, hp.beta1), g));
  const float vi =
      __fadd_rn(__fmul_rn(hp.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, hp.beta2), g), g));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), sqrt_c2), hp.eps);
  w = __fsub_rn(w, __fdiv_rn(__fmul_rn(lr, __fdiv_rn(mi, c1)), denom));
  p = w;
}

// A parameter whose four arrays are 16-byte aligned is read and written four elements a load
// (what is left past the last four, one at a time): the step moves 28 bytes an element and is
// bound by the memory's bandwidth, which one float a load leaves short.
__global__ void adamw_step_kernel(const __grid_constant__ Batch b, const float* lr_ptr,
                                  unsigned* done, AdamWF hp) {
  unsigned block = 0, blocks = 0;
  const ParamSlice& s = my_slice(b, block, blocks);
  const float lr = static_cast<float>(scheduled_lr(*lr_ptr, *s.step, hp.schedule));
  const double t = *s.step + 1.0;
  const float c1 = static_cast<float>(1.0 - pow(static_cast<double>(hp.beta1), t));
  const float c2 = static_cast<float>(1.0 - pow(static_cast<double>(hp.beta2), t));
  const float sqrt_c2 = sqrtf(c2);
  const float wd = s.weight_decay;
  float* p = s.p;
  const float* grad = s.grad;
  float* m = s.s1;
  float* v = s.s2;
  std::int64_t first_scalar = 0;
  if (!s.copy && all_16_byte_aligned(p, grad, m, v)) {
    const std::int64_t n4 = s.n / 4;
    auto* p4 = reinterpret_cast<float4*>(p);
    auto* m4 = reinterpret_cast<float4*>(m);
    auto* v4 = reinterpret_cast<float4*>(v);
    const auto* g4 = reinterpret_cast<const float4*>(grad);
    GW_SLICE_STRIDE(i, block, blocks, n4) {
      float4 w = p4[i], mi = m4[i], vi = v4[i];
      const float4 g = g4[i];
      adamw_element(w.x, g.x, mi.x, vi.x, hp, wd, lr, c1, sqrt_c2);
      adamw_element(w.y, g.y, mi.y, vi.y, hp, wd, lr, c1, sqrt_c2);
      adamw_element(w.z, g.z, mi.z, vi.z, hp, wd, lr, c1, sqrt_c2);
      adamw_element(w.w, g.w, mi.w, vi.w, hp, wd, lr, c1, sqrt_c2);
      p4[i] = w;
      m4[i] = mi;
      v4[i] = vi;
    }
    first_scalar = n4 * 4;
  }
  const std::int64_t rest = s.n - first_scalar;
  GW_SLICE_STRIDE(j, block, blocks, rest) {
    const std::int64_t i = first_scalar + j;
    adamw_element(p[i], grad_at(s, i), m[i], v[i], hp, wd, lr, c1, sqrt_c2);
    if (s.copy) put(s.copy, i, p[i]);
  }
  count_steps(b, done);
}

// Launches `kernel` over `params` in batches of kMultiTensorMax; each launch counts the steps of
// its parameters. No parameter: nothing to launch, nothing counted.
// A block takes kThreads · per_thread elements of its parameter per pass.
template <class Kernel, class Hyper>
void launch_batches(Kernel kernel, const ParamSlice* params, std::size_t count, const float* lr,
                    unsigned* done, Hyper hp, std::int64_t per_thread, cudaStream_t stream) {
  const std::int64_t per_block = kThreads * per_thread;
  for (std::size_t first = 0; first < count; first += kMultiTensorMax) {
    Batch b{};
    b.count = static_cast<int>(std::min(kMultiTensorMax, count - first));
    std::int64_t blocks = 0;
    for (int i = 0; i < b.count; ++i) {
      b.t[i] = params[first + static_cast<std::size_t>(i)];
      b.first_block[i] = static_cast<unsigned>(blocks);
      blocks += std::max<std::int64_t>(
          1, std::min<std::int64_t>((b.t[i].n + per_block - 1) / per_block, kMaxBlocks));
    }
    b.first_block[b.count] = static_cast<unsigned>(blocks);
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(b, lr, done, hp);
    GW_LAUNCH_CHECK();
  }
}

constexpr int kReduceThreads = 1024;

// At least this many elements a thread before sum_squares takes another block, and at most this
// many blocks (two of 1024 threads on each of an H100's 132 SMs).
constexpr std::int64_t kSquaresPerThread = 32;
constexpr std::int64_t kMaxSquaresBlocks = 264;

template <class S>
__global__ void sum_squares_kernel(float* out, const S* x, std::int64_t n) {
  double acc = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double xi = load(x, i);
    acc += xi * xi;
  }
  acc = detail::block_reduce<kReduceThreads>(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(acc);
}

__global__ void clip_coefficient_kernel(float* norm, float* scale, const float* parts,
                                        std::int64_t count, float max_norm) {
  double total = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) total += parts[i];
  total = detail::block_reduce<kReduceThreads>(total);
  if (threadIdx.x != 0) return;
  const double nrm = sqrt(total);
  norm[0] = static_cast<float>(nrm);
  const double s = static_cast<double>(max_norm) / (nrm + 1e-6);
  scale[0] = static_cast<float>(s < 1.0 || s != s ? s : 1.0);  // a NaN norm: NaN everywhere
}

template <class S>
__global__ void scale_by_kernel(S* x, const float* scale, std::int64_t n) {
  const float s = *scale;
  GW_GRID_STRIDE(i, n) {
    put(x, i, load(x, i) * s);
  }
}

}  // namespace

void sgd_step(const ParamSlice* params, std::size_t count, const float* lr, unsigned* done,
              SgdParams hp, cudaStream_t stream) {
  const SgdF f{static_cast<float>(hp.momentum), static_cast<float>(hp.dampening), hp.nesterov,
               hp.schedule};
  launch_batches(sgd_step_kernel, params, count, lr, done, f, 1, stream);
}
void adamw_step(const ParamSlice* params, std::size_t count, const float* lr, unsigned* done,
                AdamWParams hp, cudaStream_t stream) {
  const AdamWF f{static_cast<float>(hp.beta1), static_cast<float>(hp.beta2),
                 static_cast<float>(hp.eps), hp.schedule};
  launch_batches(adamw_step_kernel, params, count, lr, done, f, 4, stream);
}
std::int64_t sum_squares_parts(std::int64_t n) {
  const std::int64_t per_block = kReduceThreads * kSquaresPerThread;
  return std::clamp<std::int64_t>((n + per_block - 1) / per_block, 1, kMaxSquaresBlocks);
}
template <class S>
void sum_squares(float* out, const S* x, std::int64_t n, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(sum_squares_parts(n));
  sum_squares_kernel<S><<<blocks, kReduceThreads, 0, stream>>>(out, x, n);
  GW_LAUNCH_CHECK();
}
template void sum_squares<float>(float*, const float*, std::int64_t, cudaStream_t);
template void sum_squares<bf16>(float*, const bf16*, std::int64_t, cudaStream_t);
void clip_coefficient(float* norm, float* scale, const float* parts, std::int64_t count,
                      float max_norm, cudaStream_t stream) {
  clip_coefficient_kernel<<<1, kReduceThreads, 0, stream>>>(norm, scale, parts, count, max_norm);
  GW_LAUNCH_CHECK();
}
template <class S>
void scale_by(S* x, const float* scale, std::int64_t n, cudaStream_t stream) {
  scale_by_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(x, scale, n);
  GW_LAUNCH_CHECK();
}
template void scale_by<float>(float*, const float*, std::int64_t, cudaStream_t);
template void scale_by<bf16>(bf16*, const float*, std::int64_t, cudaStream_t);

}  // namespace graphward::kernels
