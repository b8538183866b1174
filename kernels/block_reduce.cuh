#pragma once
// One block-wide reduction for the .cu files of kernels/ (device code only; not a public header).
//
// Every thread passes its partial value; each warp reduces with shuffles, the warp results meet in
// shared memory and warp 0 reduces them, in a fixed tree: the result is deterministic for a given
// block size. It is returned to every thread of the block, and the shared scratch may be reused by
// the next call as soon as this one returns.
#include <cmath>

namespace graphward::kernels::detail {

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
  template <class T>
  __device__ static constexpr T identity() { return T(0); }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  template <class T>
  __device__ static constexpr T identity() { return -INFINITY; }
};

// kBlock: the block size the kernel is launched with (a multiple of 32, at most 1024).
template <int kBlock, class Op = SumOp, class T>
__device__ T block_reduce(T v, Op op = {}) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024, "block_reduce needs whole warps, at most 32");
  __shared__ T partial[kBlock / 32];
  __shared__ T result;
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kBlock / 32 ? partial[lane] : Op::template identity<T>();
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) result = v;
  }
  __syncthreads();
  const T r = result;
  __syncthreads();  // `partial` and `result` are free for the next reduction
  return r;
}

// The same reduction over one warp, by butterfly shuffles: every lane gets the result (a fixed
// order: deterministic).
template <class Op = SumOp, class T>
__device__ __forceinline__ T warp_all_reduce(T v, Op op = {}) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

}  // namespace graphward::kernels::detail
