#pragma once
// The index arithmetic of swap_dims, shared by the CUDA kernel and the CPU reference.
#include "kernels/shape.h"

#if defined(__CUDACC__)
#define GW_HD __host__ __device__
#else
#define GW_HD
#endif

namespace graphward::kernels::detail {

// The offset in x of element i of y (y: x with dims d0 and d1 swapped; both row-major).
GW_HD inline std::int64_t swapped_source(const SwapDims& d, std::int64_t i) {
  std::int64_t in_stride[kMaxDims];
  std::int64_t s = 1;
  for (int k = d.rank - 1; k >= 0; --k) {
    in_stride[k] = s;
    s *= d.in_shape[k];
  }
  std::int64_t src = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    const int from = k == d.d0 ? d.d1 : (k == d.d1 ? d.d0 : k);  // y's dim k is x's dim `from`
    const std::int64_t extent = d.in_shape[from];
    src += (i % extent) * in_stride[from];
    i /= extent;
  }
  return src;
}

}  // namespace graphward::kernels::detail
#undef GW_HD
