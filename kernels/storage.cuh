#pragma once
// Loads and stores of an element whatever its storage type (device code only; not a public
// header): float32 as is, bfloat16 (graphward::bf16, bit-compatible with __nv_bfloat16) converted
// to float32 on load and rounded to nearest, ties to even on store. Arithmetic is always float32.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "graphward/base/dtype.h"

namespace graphward::kernels::detail {

__device__ __forceinline__ float load(const float* p, std::int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const bf16* p, std::int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}

// p[i] = v, or p[i] += v (the sum in float32, then stored).
__device__ __forceinline__ void put(float* p, std::int64_t i, float v, bool accumulate = false) {
  p[i] = accumulate ? p[i] + v : v;
}
__device__ __forceinline__ void put(bf16* p, std::int64_t i, float v, bool accumulate = false) {
  __nv_bfloat16* q = reinterpret_cast<__nv_bfloat16*>(p);
  q[i] = __float2bfloat16_rn(accumulate ? __bfloat162float(q[i]) + v : v);
}

// v as S stores it, read back: v itself for float32, v rounded to bfloat16 for bf16.
template <class S>
__device__ __forceinline__ float rounded(float v) {
  if constexpr (std::is_same_v<S, bf16>) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return v;
  }
}

}  // namespace graphward::kernels::detail
