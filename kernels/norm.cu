// Layer-norm and embedding kernels. Contract in norm.h. Layer norm: rows of at most 1024 columns
// one warp a row (8 rows a block), the row held in registers (x read once), sums reduced by
// butterfly shuffles in a fixed order; wider rows one block of 256 threads a row, sums reduced in
// a fixed tree (the choice is the shape's alone, so a shape's bits never depend on its addresses);
// the parameter gradients by blocks of 32 columns x 128 rows, whose partial sums are then added in
// slice order: deterministic. The embedding gradient adds with atomics.
#include <cmath>

#include "kernels/block_reduce.cuh"
#include "kernels/elementwise.h"
#include "kernels/launch.cuh"
#include "kernels/norm.h"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::by_warp_row_width;
using detail::grid_for;
using detail::kThreads;
using detail::kWarpRowMaxCols;
using detail::store;
using detail::warp_all_reduce;

constexpr int kRowThreads = 256;
constexpr int kWarpRows = kRowThreads / 32;  // rows a block, one warp each

// Lane `lane`'s columns of a row: lane, lane + 32, ..., kPer of them (those past the row unused).
// kAdd: the row normalized is x + res (rounded as add rounds it), written to `sum` too.
template <int kPer, bool kAdd>
__global__ void layer_norm_forward_warp_kernel(float* y, float* mean, float* rstd, const float* x,
                                               const float* w, const float* b, const float* res,
                                               std::int64_t res_rows, float* sum,
                                               std::int64_t rows, int cols, float eps) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float* xr = x + row * cols;
  const float* rr = kAdd ? res + (row % res_rows) * cols : nullptr;
  float v[kPer];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if constexpr (kAdd) {
      v[i] = j < cols ? __fadd_rn(xr[j], rr[j]) : 0.f;
      if (j < cols) sum[row * cols + j] = v[i];
    } else {
      v[i] = j < cols ? xr[j] : 0.f;
    }
    if (j < cols) s += v[i];
  }
  const float m = warp_all_reduce(s) / static_cast<float>(cols);
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < cols) q += (v[i] - m) * (v[i] - m);
  }
  const float r = rsqrtf(warp_all_reduce(q) / static_cast<float>(cols) + eps);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
  float* yr = y + row * cols;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < cols) yr[j] = (v[i] - m) * r * w[j] + (b ? b[j] : 0.f);
  }
}

template <int kPer>
__global__ void layer_norm_backward_input_warp_kernel(float* dx, const float* dy, const float* x,
                                                      const float* mean, const float* rstd,
                                                      const float* w, std::int64_t rows, int cols,
                                                      bool accumulate) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float m = mean[row], r = rstd[row];
  float g[kPer], xc[kPer];  // dy·w and x − mean
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    g[i] = j < cols ? dyr[j] * w[j] : 0.f;
    xc[i] = j < cols ? xr[j] - m : 0.f;
    if (j < cols) {
      sg += g[i];
      sgx += g[i] * xc[i] * r;
    }
  }
  const float mg = warp_all_reduce(sg) / static_cast<float>(cols);
  const float mgx = warp_all_reduce(sgx) / static_cast<float>(cols);
  float* dxr = dx + row * cols;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < cols) store(dxr, j, r * (g[i] - mg - xc[i] * r * mgx), accumulate);
  }
}

__global__ void layer_norm_forward_kernel(float* y, float* mean, float* rstd, const float* x,
                                          const float* w, const float* b, std::int64_t cols,
                                          float eps) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float s = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) s += xr[j];
  const float m = block_reduce<kRowThreads>(s) / static_cast<float>(cols);
  float v = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) v += (xr[j] - m) * (xr[j] - m);
  const float r = rsqrtf(block_reduce<kRowThreads>(v) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    y[row * cols + j] = (xr[j] - m) * r * w[j] + (b ? b[j] : 0.f);
  }
}

__global__ void layer_norm_backward_input_kernel(float* dx, const float* dy, const float* x,
                                                 const float* mean, const float* rstd,
                                                 const float* w, std::int64_t cols,
                                                 bool accumulate) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float m = mean[row], r = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float g = dyr[j] * w[j];
    sg += g;
    sgx += g * (xr[j] - m) * r;
  }
  const float mg = block_reduce<kRowThreads>(sg) / static_cast<float>(cols);
  const float mgx = block_reduce<kRowThreads>(sgx) / static_cast<float>(cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float xh = (xr[j] - m) * r;
    store(dx, row * cols + j, r * (dyr[j] * w[j] - mg - xh * mgx), accumulate);
  }
}

// Rows of a slice per block of the parameter gradient's first pass.
constexpr std::int64_t kRowsPerSlice = 128;
std::int64_t row_slices(std::int64_t rows) {
  return (rows + kRowsPerSlice - 1) / kRowsPerSlice;
}

// Block (32, 8) per (32 columns, slice of rows): the slice's sums of dy·x̂ and dy per column, in a
// fixed order; written to partial [slices, cols] (two of them), or — with one slice — stored as
// the gradients themselves.
__global__ void layer_norm_params_partial_kernel(float* pw, float* pb, float* dw, float* db,
                                                 const float* dy, const float* x, const float* mean,
                                                 const float* rstd, std::int64_t rows,
                                                 std::int64_t cols, bool accumulate_w,
                                                 bool accumulate_b) {
  __shared__ float sw[8][33], sb[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * kRowsPerSlice;
  const std::int64_t end = begin + kRowsPerSlice < rows ? begin + kRowsPerSlice : rows;
  float aw = 0.f, ab = 0.f;
  if (col < cols) {
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const std::int64_t i = r * cols + col;
      aw += dy[i] * (x[i] - mean[r]) * rstd[r];
      ab += dy[i];
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float tw = 0.f, tb = 0.f;
    for (int s = 0; s < 8; ++s) {
      tw += sw[s][threadIdx.x];
      tb += sb[s][threadIdx.x];
    }
    if (pw) {
      pw[blockIdx.y * cols + col] = tw;
      pb[blockIdx.y * cols + col] = tb;
    } else {
      if (dw) store(dw, col, tw, accumulate_w);
      if (db) store(db, col, tb, accumulate_b);
    }
  }
}

// The slices' partial sums per column, in slice order.
__global__ void layer_norm_params_sum_kernel(float* dw, float* db, const float* pw, const float* pb,
                                             std::int64_t slices, std::int64_t cols,
                                             bool accumulate_w, bool accumulate_b) {
  GW_GRID_STRIDE(col, cols) {
    float tw = 0.f, tb = 0.f;
    for (std::int64_t s = 0; s < slices; ++s) {
      tw += pw[s * cols + col];
      tb += pb[s * cols + col];
    }
    if (dw) store(dw, col, tw, accumulate_w);
    if (db) store(db, col, tb, accumulate_b);
  }
}

__global__ void embedding_forward_kernel(float* y, const float* table, const std::int32_t* ids,
                                         std::int64_t n, std::int64_t vocab, std::int64_t dim) {
  GW_GRID_STRIDE(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int32_t id = ids[i];
    y[k] = (id >= 0 && id < vocab) ? table[static_cast<std::int64_t>(id) * dim + j] : NAN;
  }
}

__global__ void embedding_backward_kernel(float* dtable, const float* dy, const std::int32_t* ids,
                                          std::int64_t n, std::int64_t vocab, std::int64_t dim) {
  GW_GRID_STRIDE(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int32_t id = ids[i];
    if (id >= 0 && id < vocab) atomicAdd(dtable + static_cast<std::int64_t>(id) * dim + j, dy[k]);
  }
}

}  // namespace

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, std::int64_t rows, std::int64_t cols, float eps,
                        cudaStream_t stream) {
  if (cols <= kWarpRowMaxCols) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
    by_warp_row_width(cols, [&](auto per) {
      layer_norm_forward_warp_kernel<decltype(per)::value, false>
          <<<blocks, kRowThreads, 0, stream>>>(y, mean, rstd, x, w, b, nullptr, 1, nullptr,
                                               rows, static_cast<int>(cols), eps);
    });
  } else {
    layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        y, mean, rstd, x, w, b, cols, eps);
  }
  GW_LAUNCH_CHECK();
}
void add_layer_norm_forward(float* y, float* sum, float* mean, float* rstd, const float* x,
                            const float* res, std::int64_t res_rows, const float* w,
                            const float* b, std::int64_t rows, std::int64_t cols, float eps,
                            cudaStream_t stream) {
  if (cols > kWarpRowMaxCols) {  // a block a row: the add first, then the layer norm of its sum
    binary_forward(BinaryOp::kAdd, sum, x, rows * cols, res, res_rows * cols, rows * cols, stream);
    layer_norm_forward(y, mean, rstd, sum, w, b, rows, cols, eps, stream);
    return;
  }
  const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
  by_warp_row_width(cols, [&](auto per) {
    layer_norm_forward_warp_kernel<decltype(per)::value, true><<<blocks, kRowThreads, 0, stream>>>(
        y, mean, rstd, x, w, b, res, res_rows, sum, rows, static_cast<int>(cols), eps);
  });
  GW_LAUNCH_CHECK();
}
void layer_norm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                               const float* rstd, const float* w, std::int64_t rows,
                               std::int64_t cols, bool accumulate, cudaStream_t stream) {
  if (cols <= kWarpRowMaxCols) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
    by_warp_row_width(cols, [&](auto per) {
      layer_norm_backward_input_warp_kernel<decltype(per)::value>
          <<<blocks, kRowThreads, 0, stream>>>(dx, dy, x, mean, rstd, w, rows,
                                               static_cast<int>(cols), accumulate);
    });
  } else {
    layer_norm_backward_input_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        dx, dy, x, mean, rstd, w, cols, accumulate);
  }
  GW_LAUNCH_CHECK();
}
std::int64_t layer_norm_params_workspace(std::int64_t rows, std::int64_t cols) {
  const std::int64_t slices = row_slices(rows);
  return slices > 1 ? 2 * slices * cols : 0;
}

void layer_norm_backward_params(float* dw, float* db, const float* dy, const float* x,
                                const float* mean, const float* rstd, std::int64_t rows,
                                std::int64_t cols, bool accumulate_w, bool accumulate_b,
                                float* workspace, cudaStream_t stream) {
  const std::int64_t slices = row_slices(rows);
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(slices));
  float* pw = slices > 1 ? workspace : nullptr;
  float* pb = slices > 1 ? workspace + slices * cols : nullptr;
  layer_norm_params_partial_kernel<<<grid, block, 0, stream>>>(
      pw, pb, dw, db, dy, x, mean, rstd, rows, cols, accumulate_w, accumulate_b);
  GW_LAUNCH_CHECK();
  if (slices > 1) {
    layer_norm_params_sum_kernel<<<grid_for(cols), kThreads, 0, stream>>>(
        dw, db, pw, pb, slices, cols, accumulate_w, accumulate_b);
    GW_LAUNCH_CHECK();
  }
}
void embedding_forward(float* y, const float* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t dim, cudaStream_t stream) {
  embedding_forward_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(y, table, ids, n, vocab,
                                                                       dim);
  GW_LAUNCH_CHECK();
}
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate,
                        cudaStream_t stream) {
  if (!accumulate) {
    GW_CUDA_CHECK(
        cudaMemsetAsync(dtable, 0, static_cast<std::size_t>(vocab * dim) * sizeof(float), stream));
  }
  embedding_backward_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(dtable, dy, ids, n, vocab,
                                                                        dim);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
