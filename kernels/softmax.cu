// Softmax kernels: a row per warp (8 rows per block of 256 threads) up to 1024 columns, the row
// held in registers (read once), else a row per block of 256 threads; the row's maximum and sums
// reduced in a fixed order (deterministic; the registers change no bit: the same order).
// Contract in softmax.h.
#include <cmath>
#include <type_traits>

#include "graphward/kernels/block_reduce.cuh"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/softmax.h"
#include "graphward/kernels/storage.cuh"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::by_warp_row_width;
using detail::grid_for;
using detail::kThreads;
using detail::kWarpRowMaxCols;
using detail::load;
using detail::put;

constexpr int kRowThreads = 256;

// Who works on a row: a whole block (long rows) or one warp (short rows, 8 per block).
struct BlockRow {
  static constexpr int kSize = kRowThreads;
  __device__ static std::int64_t row() { return blockIdx.x; }
  __device__ static int lane() { return threadIdx.x; }
  template <class Op>
  __device__ static float reduce(float v, Op op) {
    return block_reduce<kRowThreads>(v, op);
  }
};
struct WarpRow {
  static constexpr int kSize = 32;
  __device__ static std::int64_t row() {
    return static_cast<std::int64_t>(blockIdx.x) * (kRowThreads / 32) + threadIdx.x / 32;
  }
  __device__ static int lane() { return threadIdx.x % 32; }
  template <class Op>
  __device__ static float reduce(float v, Op op) {
    return detail::warp_all_reduce(v, op);
  }
};

// log Σ exp(x_j) of one row in two parts, its maximum and log Σ exp(x_j − max), in every thread of
// the group (softmax.h: each output is (x − max) − log Σ, never x − (max + log Σ)).
struct RowLse {
  float max, log_sum, sum;  // sum: Σ exp(x_j − max)
};
template <class G, class S>
__device__ RowLse row_lse(const S* x, std::int64_t cols) {
  float m = -INFINITY;
  for (std::int64_t j = G::lane(); j < cols; j += G::kSize) m = fmaxf(m, load(x, j));
  m = G::reduce(m, detail::MaxOp{});
  float s = 0.f;
  for (std::int64_t j = G::lane(); j < cols; j += G::kSize) s += expf(load(x, j) - m);
  s = G::reduce(s, detail::SumOp{});
  return {m, logf(s), s};
}

// The columns of row `row` a causal softmax keeps (softmax.h): those up to its query's position.
__device__ inline std::int64_t causal_cols(std::int64_t row, std::int64_t cols,
                                           std::int64_t queries) {
  const std::int64_t n = row % queries + 1;
  return n < cols ? n : cols;
}

// kCausal: row `row` keeps its first causal_cols(row) columns, the others 0 (never kLog).
template <class G, bool kLog, bool kCausal, class S>
__global__ void softmax_forward_kernel(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                                       std::int64_t queries) {
  const std::int64_t row = G::row();
  if (row >= rows) return;  // a whole warp (WarpRow) or never (BlockRow)
  const S* xr = x + row * cols;
  S* yr = y + row * cols;
  const std::int64_t kept = kCausal ? causal_cols(row, cols, queries) : cols;
  const RowLse r = row_lse<G>(xr, kept);
  const float inv = 1.f / r.sum;
  for (std::int64_t j = G::lane(); j < cols; j += G::kSize) {
    if (kCausal && j >= kept) {
      put(yr, j, 0.f);
    } else {
      const float v = load(xr, j);
      put(yr, j, kLog ? (v - r.max) - r.log_sum : expf(v - r.max) * inv);
    }
  }
}

template <class G, bool kLog, class S>
__global__ void softmax_backward_kernel(S* dx, const S* dy, const S* y, std::int64_t rows,
                                        std::int64_t cols, bool accumulate) {
  const std::int64_t row = G::row();
  if (row >= rows) return;
  const S* dyr = dy + row * cols;
  const S* yr = y + row * cols;
  float s = 0.f;
  for (std::int64_t j = G::lane(); j < cols; j += G::kSize) {
    s += kLog ? load(dyr, j) : load(dyr, j) * load(yr, j);
  }
  s = G::reduce(s, detail::SumOp{});
  for (std::int64_t j = G::lane(); j < cols; j += G::kSize) {
    const float d = load(dyr, j), p = load(yr, j);
    const float g = kLog ? d - expf(p) * s : p * (d - s);
    put(dx, row * cols + j, g, accumulate);
  }
}

// The WarpRow kernels above with the row in registers: lane `lane` holds columns lane, lane + 32,
// ..., kPer of them; every sum and maximum in the same order, so the same bits.
// kCausal: as softmax_forward_kernel's; the masked columns are neither read nor summed.
template <int kPer, bool kLog, bool kCausal, class S>
__global__ void softmax_forward_warp_kernel(S* y, const S* x, std::int64_t rows, int cols,
                                            std::int64_t queries) {
  const std::int64_t row = WarpRow::row();
  if (row >= rows) return;  // the whole warp
  const int lane = WarpRow::lane();
  const S* xr = x + row * cols;
  const int kept = kCausal ? static_cast<int>(causal_cols(row, cols, queries)) : cols;
  float v[kPer];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    v[i] = j < kept ? load(xr, j) : 0.f;
    if (j < kept) m = fmaxf(m, v[i]);
  }
  m = detail::warp_all_reduce(m, detail::MaxOp{});
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < kept) {
      const float e = expf(v[i] - m);
      if constexpr (!kLog) v[i] = e;  // softmax keeps exp(x − m): one exp an element
      s += e;
    }
  }
  s = detail::warp_all_reduce(s, detail::SumOp{});
  S* yr = y + row * cols;
  if constexpr (kLog) {
    const float log_sum = logf(s);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j < cols) put(yr, j, (v[i] - m) - log_sum);
    }
  } else {
    const float inv = 1.f / s;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j < cols) put(yr, j, kCausal && j >= kept ? 0.f : v[i] * inv);
    }
  }
}

template <int kPer, bool kLog, class S>
__global__ void softmax_backward_warp_kernel(S* dx, const S* dy, const S* y, std::int64_t rows,
                                             int cols, bool accumulate) {
  const std::int64_t row = WarpRow::row();
  if (row >= rows) return;
  const int lane = WarpRow::lane();
  const S* dyr = dy + row * cols;
  const S* yr = y + row * cols;
  float d[kPer], p[kPer];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    d[i] = j < cols ? load(dyr, j) : 0.f;
    p[i] = j < cols ? load(yr, j) : 0.f;
    if (j < cols) s += kLog ? d[i] : d[i] * p[i];
  }
  s = detail::warp_all_reduce(s, detail::SumOp{});
  S* dxr = dx + row * cols;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < cols) put(dxr, j, kLog ? d[i] - expf(p[i]) * s : p[i] * (d[i] - s), accumulate);
  }
}

template <class G, class S>
__global__ void row_lse_kernel(float* lse, const S* x, std::int64_t rows, std::int64_t cols,
                               std::int64_t ld) {
  const std::int64_t row = G::row();
  if (row >= rows) return;
  const RowLse r = row_lse<G>(x + row * ld, cols);
  if (G::lane() == 0) {
    lse[2 * row] = r.max;
    lse[2 * row + 1] = r.log_sum;
  }
}

// Runs kernel<WarpRow> or kernel<BlockRow> over `rows` rows of `cols` columns.
template <class Launch>
void by_rows(std::int64_t rows, std::int64_t cols, Launch launch) {
  if (cols <= kWarpRowMaxCols) {
    launch(WarpRow{}, static_cast<unsigned>((rows + kRowThreads / 32 - 1) / (kRowThreads / 32)));
  } else {
    launch(BlockRow{}, static_cast<unsigned>(rows));
  }
  GW_LAUNCH_CHECK();
}

constexpr int kMeanThreads = 1024;

template <class S>
__global__ void cross_entropy_mean_kernel(float* loss, const float* lse, const S* x,
                                          const std::int32_t* target, std::int64_t rows,
                                          std::int64_t cols, std::int64_t ld) {
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kMeanThreads) {
    const std::int32_t t = target[i];
    acc += (t >= 0 && t < cols) ? static_cast<double>(lse[2 * i] - load(x, i * ld + t)) +
                                      static_cast<double>(lse[2 * i + 1])
                                : static_cast<double>(NAN);
  }
  acc = block_reduce<kMeanThreads>(acc);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(acc / static_cast<double>(rows));
}

template <class S>
__global__ void cross_entropy_backward_kernel(S* dx, const float* dloss, const S* x,
                                              const float* lse, const std::int32_t* target,
                                              std::int64_t rows, std::int64_t cols,
                                              std::int64_t ld, bool accumulate) {
  const float scale = dloss[0] / static_cast<float>(rows);
  GW_GRID_STRIDE(i, rows * ld) {
    const std::int64_t r = i / ld, j = i % ld;
    if (j >= cols) {  // a padding column: no part in the loss, no gradient
      if (!accumulate) put(dx, i, 0.f, false);
      continue;
    }
    const float p = expf((load(x, i) - lse[2 * r]) - lse[2 * r + 1]);
    put(dx, i, (p - (j == target[r] ? 1.f : 0.f)) * scale, accumulate);
  }
}

// Forward (kLog: log-softmax; kCausal: the causal softmax of [.., queries, cols] matrices) by
// rows: a warp a row in registers, or a block a row.
template <bool kLog, bool kCausal = false, class S>
void softmax_forward_rows(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                          cudaStream_t stream, std::int64_t queries = 0) {
  by_rows(rows, cols, [&]<class G>(G, unsigned blocks) {
    if constexpr (std::is_same_v<G, WarpRow>) {
      by_warp_row_width(cols, [&](auto per) {
        softmax_forward_warp_kernel<decltype(per)::value, kLog, kCausal>
            <<<blocks, kRowThreads, 0, stream>>>(y, x, rows, static_cast<int>(cols), queries);
      });
    } else {
      softmax_forward_kernel<G, kLog, kCausal>
          <<<blocks, kRowThreads, 0, stream>>>(y, x, rows, cols, queries);
    }
  });
}
template <bool kLog, class S>
void softmax_backward_rows(S* dx, const S* dy, const S* y, std::int64_t rows, std::int64_t cols,
                           bool accumulate, cudaStream_t stream) {
  by_rows(rows, cols, [&]<class G>(G, unsigned blocks) {
    if constexpr (std::is_same_v<G, WarpRow>) {
      by_warp_row_width(cols, [&](auto per) {
        softmax_backward_warp_kernel<decltype(per)::value, kLog>
            <<<blocks, kRowThreads, 0, stream>>>(dx, dy, y, rows, static_cast<int>(cols),
                                                 accumulate);
      });
    } else {
      softmax_backward_kernel<G, kLog>
          <<<blocks, kRowThreads, 0, stream>>>(dx, dy, y, rows, cols, accumulate);
    }
  });
}

}  // namespace

// S: float or bf16 (storage; the arithmetic is float32 either way).
template <class S>
void softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  softmax_forward_rows<false>(y, x, rows, cols, stream);
}
template <class S>
void log_softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                         cudaStream_t stream) {
  softmax_forward_rows<true>(y, x, rows, cols, stream);
}
template <class S>
void causal_softmax_forward(S* y, const S* x, std::int64_t rows, std::int64_t cols,
                            std::int64_t queries, cudaStream_t stream) {
  softmax_forward_rows<false, true>(y, x, rows, cols, stream, queries);
}
template <class S>
void softmax_backward(S* dx, const S* dy, const S* y, std::int64_t rows, std::int64_t cols,
                      bool accumulate, cudaStream_t stream) {
  softmax_backward_rows<false>(dx, dy, y, rows, cols, accumulate, stream);
}
template <class S>
void log_softmax_backward(S* dx, const S* dy, const S* y, std::int64_t rows, std::int64_t cols,
                          bool accumulate, cudaStream_t stream) {
  softmax_backward_rows<true>(dx, dy, y, rows, cols, accumulate, stream);
}
template <class S>
void cross_entropy_forward(float* loss, float* lse, const S* x, const std::int32_t* target,
                           std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           cudaStream_t stream) {
  by_rows(rows, cols, [&]<class G>(G, unsigned blocks) {
    row_lse_kernel<G><<<blocks, kRowThreads, 0, stream>>>(lse, x, rows, cols, ld);
  });
  cross_entropy_mean_kernel<<<1, kMeanThreads, 0, stream>>>(loss, lse, x, target, rows, cols,
                                                            ld);
  GW_LAUNCH_CHECK();
}
template <class S>
void cross_entropy_backward(S* dx, const float* dloss, const S* x, const float* lse,
                            const std::int32_t* target, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, bool accumulate, cudaStream_t stream) {
  cross_entropy_backward_kernel<<<grid_for(rows * ld), kThreads, 0, stream>>>(
      dx, dloss, x, lse, target, rows, cols, ld, accumulate);
  GW_LAUNCH_CHECK();
}

#define GW_SOFTMAX_INSTANTIATE(S)                                                                 \
  template void softmax_forward(S*, const S*, std::int64_t, std::int64_t, cudaStream_t);         \
  template void log_softmax_forward(S*, const S*, std::int64_t, std::int64_t, cudaStream_t);     \
  template void causal_softmax_forward(S*, const S*, std::int64_t, std::int64_t, std::int64_t,   \
                                       cudaStream_t);                                            \
  template void softmax_backward(S*, const S*, const S*, std::int64_t, std::int64_t, bool,       \
                                 cudaStream_t);                                                  \
  template void log_softmax_backward(S*, const S*, const S*, std::int64_t, std::int64_t, bool,   \
                                     cudaStream_t);                                              \
  template void cross_entropy_forward(float*, float*, const S*, const std::int32_t*,             \
                                      std::int64_t, std::int64_t, std::int64_t, cudaStream_t);   \
  template void cross_entropy_backward(S*, const float*, const S*, const float*,                 \
                                       const std::int32_t*, std::int64_t, std::int64_t,          \
                                       std::int64_t, bool, cudaStream_t);
GW_SOFTMAX_INSTANTIATE(float)
GW_SOFTMAX_INSTANTIATE(bf16)
#undef GW_SOFTMAX_INSTANTIATE

}  // namespace graphward::kernels
