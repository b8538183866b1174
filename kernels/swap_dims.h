#pragma once
// The index arithmetic of swap_dims and split_heads, shared by the CUDA kernels and the CPU
// reference.
//
// A swap of dimensions d0 < d1 of any shape is a swap of the middle dimensions D0 and D1 of the
// 5-d shape [A, D0, M, D1, C] (A: the product of the dimensions before d0, M: between, C: after),
// whose output is [A, D1, M, D0, C]: four divisions per element whatever the rank.
#include <cstdint>

#include "graphward/kernels/shape.h"

#if defined(__CUDACC__)
#define GW_HD __host__ __device__
#else
#define GW_HD
#endif

namespace graphward::kernels::detail {

struct Swap5 {
  std::int64_t a, d0, m, d1, c;
};

inline Swap5 collapse(const SwapDims& d) {
  const int lo = d.d0 < d.d1 ? d.d0 : d.d1, hi = d.d0 < d.d1 ? d.d1 : d.d0;
  Swap5 s{1, d.in_shape[lo], 1, lo == hi ? 1 : d.in_shape[hi], 1};
  if (lo == hi) return {1, 1, 1, 1, 0};  // no swap: callers copy (c = 0 marks it)
  for (int k = 0; k < lo; ++k) s.a *= d.in_shape[k];
  for (int k = lo + 1; k < hi; ++k) s.m *= d.in_shape[k];
  for (int k = hi + 1; k < d.rank; ++k) s.c *= d.in_shape[k];
  return s;
}

// The offset in x of element i of y. Index: std::int64_t, or std::uint32_t where every offset fits.
template <class Index>
GW_HD inline Index swapped_source(const Swap5& s, Index i) {
  const Index c = static_cast<Index>(s.c), d0 = static_cast<Index>(s.d0),
              m = static_cast<Index>(s.m), d1 = static_cast<Index>(s.d1);
  const Index ic = i % c;
  i /= c;
  const Index i0 = i % d0;  // y's fourth dimension is x's second
  i /= d0;
  const Index im = i % m;
  i /= m;
  const Index i1 = i % d1;
  const Index ia = i / d1;
  return (((ia * d0 + i0) * m + im) * d1 + i1) * c + ic;
}

// The offset in x of element i of split_heads' y (HeadsWindow, shape.h).
template <class Index>
GW_HD inline Index heads_source(const HeadsWindow& w, Index i) {
  const Index dim = static_cast<Index>(w.dim), seq = static_cast<Index>(w.seq),
              heads = static_cast<Index>(w.heads);
  const Index j = i % dim;
  i /= dim;
  const Index t = i % seq;
  i /= seq;
  const Index h = i % heads;
  const Index b = i / heads;
  return (b * seq + t) * static_cast<Index>(w.cols) + static_cast<Index>(w.start) + h * dim + j;
}

// The offset in y of the window's element at row `row` of x and column `c` of the window.
template <class Index>
GW_HD inline Index heads_target(const HeadsWindow& w, Index row, Index c) {
  const Index dim = static_cast<Index>(w.dim), seq = static_cast<Index>(w.seq);
  const Index t = row % seq, b = row / seq, h = c / dim, j = c % dim;
  return ((b * static_cast<Index>(w.heads) + h) * seq + t) * dim + j;
}

}  // namespace graphward::kernels::detail
#undef GW_HD
