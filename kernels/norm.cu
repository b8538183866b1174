// Layer-norm and embedding kernels. Contract in norm.h. Layer norm: rows of at most 1024 columns
// one warp a row (8 rows a block), the row held in registers (x read once), sums reduced by
// butterfly shuffles in a fixed order; wider rows one block of 256 threads a row, sums reduced in
// a fixed tree (the choice is the shape's alone, so a shape's bits never depend on its addresses);
// the parameter gradients by blocks of 32 columns x 128 rows, whose partial sums are then added in
// slice order: deterministic. The embedding gradient adds with atomics.
#include <cmath>
#include <type_traits>

#include "graphward/kernels/block_reduce.cuh"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/launch.cuh"
#include "graphward/kernels/norm.h"
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
using detail::warp_all_reduce;

constexpr int kRowThreads = 256;
constexpr int kWarpRows = kRowThreads / 32;  // rows a block, one warp each

// Lane `lane`'s columns of a row: lane, lane + 32, ..., kPer of them (those past the row unused).
// kAdd: the row normalized is x + res (rounded as add rounds it), written to `sum` too; R is res's
// storage (S, or bfloat16 for float32 S: widened as it is read).
template <int kPer, bool kAdd, class S, class Y, class R>
__global__ void layer_norm_forward_warp_kernel(Y* y, float* mean, float* rstd, const S* x,
                                               const S* w, const S* b, const R* res,
                                               std::int64_t res_rows, S* sum, std::int64_t rows,
                                               int cols, float eps) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const S* xr = x + row * cols;
  const R* rr = kAdd ? res + (row % res_rows) * cols : nullptr;
  float v[kPer];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if constexpr (kAdd) {
      // The sum as stored (rounded to S): the row normalized is the one `sum` holds.
      v[i] = j < cols ? detail::rounded<S>(__fadd_rn(load(xr, j), load(rr, j))) : 0.f;
      if (j < cols) put(sum, row * cols + j, v[i]);
    } else {
      v[i] = j < cols ? load(xr, j) : 0.f;
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
  Y* yr = y + row * cols;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < cols) put(yr, j, (v[i] - m) * r * load(w, j) + (b ? load(b, j) : 0.f));
  }
}

template <int kPer, class S, class Y>
__global__ void layer_norm_backward_input_warp_kernel(S* dx, const Y* dy, const S* x,
                                                      const float* mean, const float* rstd,
                                                      const S* w, std::int64_t rows, int cols,
                                                      bool accumulate) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const S* xr = x + row * cols;
  const Y* dyr = dy + row * cols;
  const float m = mean[row], r = rstd[row];
  float g[kPer], xc[kPer];  // dy·w and x − mean
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    g[i] = j < cols ? load(dyr, j) * load(w, j) : 0.f;
    xc[i] = j < cols ? load(xr, j) - m : 0.f;
    if (j < cols) {
      sg += g[i];
      sgx += g[i] * xc[i] * r;
    }
  }
  const float mg = warp_all_reduce(sg) / static_cast<float>(cols);
  const float mgx = warp_all_reduce(sgx) / static_cast<float>(cols);
  S* dxr = dx + row * cols;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < cols) put(dxr, j, r * (g[i] - mg - xc[i] * r * mgx), accumulate);
  }
}

template <class S, class Y>
__global__ void layer_norm_forward_kernel(Y* y, float* mean, float* rstd, const S* x, const S* w,
                                          const S* b, std::int64_t cols, float eps) {
  const std::int64_t row = blockIdx.x;
  const S* xr = x + row * cols;
  float s = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) s += load(xr, j);
  const float m = block_reduce<kRowThreads>(s) / static_cast<float>(cols);
  float v = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    v += (load(xr, j) - m) * (load(xr, j) - m);
  }
  const float r = rsqrtf(block_reduce<kRowThreads>(v) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    put(y, row * cols + j, (load(xr, j) - m) * r * load(w, j) + (b ? load(b, j) : 0.f));
  }
}

template <class S, class Y>
__global__ void layer_norm_backward_input_kernel(S* dx, const Y* dy, const S* x, const float* mean,
                                                 const float* rstd, const S* w, std::int64_t cols,
                                                 bool accumulate) {
  const std::int64_t row = blockIdx.x;
  const S* xr = x + row * cols;
  const Y* dyr = dy + row * cols;
  const float m = mean[row], r = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float g = load(dyr, j) * load(w, j);
    sg += g;
    sgx += g * (load(xr, j) - m) * r;
  }
  const float mg = block_reduce<kRowThreads>(sg) / static_cast<float>(cols);
  const float mgx = block_reduce<kRowThreads>(sgx) / static_cast<float>(cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += kRowThreads) {
    const float xh = (load(xr, j) - m) * r;
    put(dx, row * cols + j, r * (load(dyr, j) * load(w, j) - mg - xh * mgx), accumulate);
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
template <class S, class Y>
__global__ void layer_norm_params_partial_kernel(float* pw, float* pb, S* dw, S* db, const Y* dy,
                                                 const S* x, const float* mean, const float* rstd,
                                                 std::int64_t rows, std::int64_t cols,
                                                 bool accumulate_w, bool accumulate_b) {
  __shared__ float sw[8][33], sb[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * kRowsPerSlice;
  const std::int64_t end = begin + kRowsPerSlice < rows ? begin + kRowsPerSlice : rows;
  float aw = 0.f, ab = 0.f;
  if (col < cols) {
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const std::int64_t i = r * cols + col;
      aw += load(dy, i) * (load(x, i) - mean[r]) * rstd[r];
      ab += load(dy, i);
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
      if (dw) put(dw, col, tw, accumulate_w);
      if (db) put(db, col, tb, accumulate_b);
    }
  }
}

// The slices' partial sums per column, in slice order.
template <class S>
__global__ void layer_norm_params_sum_kernel(S* dw, S* db, const float* pw, const float* pb,
                                             std::int64_t slices, std::int64_t cols,
                                             bool accumulate_w, bool accumulate_b) {
  GW_GRID_STRIDE(col, cols) {
    float tw = 0.f, tb = 0.f;
    for (std::int64_t s = 0; s < slices; ++s) {
      tw += pw[s * cols + col];
      tb += pb[s * cols + col];
    }
    if (dw) put(dw, col, tw, accumulate_w);
    if (db) put(db, col, tb, accumulate_b);
  }
}

template <class S>
__global__ void embedding_forward_kernel(S* y, const S* table, const std::int32_t* ids,
                                         std::int64_t n, std::int64_t vocab, std::int64_t dim) {
  GW_GRID_STRIDE(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int32_t id = ids[i];
    put(y, k, (id >= 0 && id < vocab) ? load(table, static_cast<std::int64_t>(id) * dim + j) : NAN);
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

// bfloat16: the rows' float32 sums (workspace) added from bfloat16 dy, then each rounded once.
__global__ void embedding_backward_kernel(float* sums, const bf16* dy, const std::int32_t* ids,
                                          std::int64_t n, std::int64_t vocab, std::int64_t dim) {
  GW_GRID_STRIDE(k, n * dim) {
    const std::int64_t i = k / dim, j = k % dim;
    const std::int32_t id = ids[i];
    if (id >= 0 && id < vocab) {
      atomicAdd(sums + static_cast<std::int64_t>(id) * dim + j, load(dy, k));
    }
  }
}
__global__ void embedding_backward_round_kernel(bf16* dtable, const float* sums, std::int64_t n,
                                                bool accumulate) {
  GW_GRID_STRIDE(k, n) put(dtable, k, sums[k], accumulate);
}

// sum = x + res widened (res [res_n] repeated over x [n]): binary_forward's float32 add.
__global__ void add_widened_kernel(float* sum, const float* x, const bf16* res, std::int64_t n,
                                   std::int64_t res_n) {
  GW_GRID_STRIDE(i, n) sum[i] = __fadd_rn(x[i], load(res, i % res_n));
}

}  // namespace

namespace {
// The launchers of the forms below: S the storage of x (and the sum, w, b, dx, dw, db), Y that of
// y and dy (S, or bfloat16 for float32 S: Note [Autocast]'s normalized output).
template <class S, class Y>
void launch_forward(Y* y, float* mean, float* rstd, const S* x, const S* w, const S* b,
                    std::int64_t rows, std::int64_t cols, float eps, cudaStream_t stream) {
  if (cols <= kWarpRowMaxCols) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
    by_warp_row_width(cols, [&](auto per) {
      layer_norm_forward_warp_kernel<decltype(per)::value, false, S, Y, S>
          <<<blocks, kRowThreads, 0, stream>>>(y, mean, rstd, x, w, b, nullptr, 1, nullptr, rows,
                                               static_cast<int>(cols), eps);
    });
  } else {
    layer_norm_forward_kernel<S, Y><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        y, mean, rstd, x, w, b, cols, eps);
  }
  GW_LAUNCH_CHECK();
}
template <class S, class Y, class R>
void launch_add_forward(Y* y, S* sum, float* mean, float* rstd, const S* x, const R* res,
                        std::int64_t res_rows, const S* w, const S* b, std::int64_t rows,
                        std::int64_t cols, float eps, cudaStream_t stream) {
  if (cols > kWarpRowMaxCols) {  // a block a row: the add first, then the layer norm of its sum
    if constexpr (std::is_same_v<R, S>) {
      binary_forward(BinaryOp::kAdd, sum, x, rows * cols, res, res_rows * cols, rows * cols,
                     stream);
    } else {
      add_widened_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(sum, x, res, rows * cols,
                                                                         res_rows * cols);
      GW_LAUNCH_CHECK();
    }
    launch_forward<S, Y>(y, mean, rstd, sum, w, b, rows, cols, eps, stream);
    return;
  }
  const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
  by_warp_row_width(cols, [&](auto per) {
    layer_norm_forward_warp_kernel<decltype(per)::value, true, S, Y, R>
        <<<blocks, kRowThreads, 0, stream>>>(y, mean, rstd, x, w, b, res, res_rows, sum, rows,
                                             static_cast<int>(cols), eps);
  });
  GW_LAUNCH_CHECK();
}
template <class S, class Y>
void launch_backward_input(S* dx, const Y* dy, const S* x, const float* mean, const float* rstd,
                           const S* w, std::int64_t rows, std::int64_t cols, bool accumulate,
                           cudaStream_t stream) {
  if (cols <= kWarpRowMaxCols) {
    const auto blocks = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
    by_warp_row_width(cols, [&](auto per) {
      layer_norm_backward_input_warp_kernel<decltype(per)::value, S, Y>
          <<<blocks, kRowThreads, 0, stream>>>(dx, dy, x, mean, rstd, w, rows,
                                               static_cast<int>(cols), accumulate);
    });
  } else {
    layer_norm_backward_input_kernel<S, Y>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(dx, dy, x, mean, rstd, w, cols,
                                                                  accumulate);
  }
  GW_LAUNCH_CHECK();
}
template <class S, class Y>
void launch_backward_params(S* dw, S* db, const Y* dy, const S* x, const float* mean,
                            const float* rstd, std::int64_t rows, std::int64_t cols,
                            bool accumulate_w, bool accumulate_b, float* workspace,
                            cudaStream_t stream) {
  const std::int64_t slices = row_slices(rows);
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(slices));
  float* pw = slices > 1 ? workspace : nullptr;
  float* pb = slices > 1 ? workspace + slices * cols : nullptr;
  layer_norm_params_partial_kernel<S, Y><<<grid, block, 0, stream>>>(
      pw, pb, dw, db, dy, x, mean, rstd, rows, cols, accumulate_w, accumulate_b);
  GW_LAUNCH_CHECK();
  if (slices > 1) {
    layer_norm_params_sum_kernel<S><<<grid_for(cols), kThreads, 0, stream>>>(
        dw, db, pw, pb, slices, cols, accumulate_w, accumulate_b);
    GW_LAUNCH_CHECK();
  }
}
}  // namespace

template <class S>
void layer_norm_forward(S* y, float* mean, float* rstd, const S* x, const S* w, const S* b,
                        std::int64_t rows, std::int64_t cols, float eps, cudaStream_t stream) {
  launch_forward<S, S>(y, mean, rstd, x, w, b, rows, cols, eps, stream);
}
void layer_norm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, std::int64_t rows, std::int64_t cols, float eps,
                        cudaStream_t stream) {
  launch_forward<float, bf16>(y, mean, rstd, x, w, b, rows, cols, eps, stream);
}
template <class S>
void add_layer_norm_forward(S* y, S* sum, float* mean, float* rstd, const S* x, const S* res,
                            std::int64_t res_rows, const S* w, const S* b, std::int64_t rows,
                            std::int64_t cols, float eps, cudaStream_t stream) {
  launch_add_forward<S, S, S>(y, sum, mean, rstd, x, res, res_rows, w, b, rows, cols, eps,
                              stream);
}
void add_layer_norm_forward(bf16* y, float* sum, float* mean, float* rstd, const float* x,
                            const float* res, std::int64_t res_rows, const float* w,
                            const float* b, std::int64_t rows, std::int64_t cols, float eps,
                            cudaStream_t stream) {
  launch_add_forward<float, bf16, float>(y, sum, mean, rstd, x, res, res_rows, w, b, rows, cols,
                                         eps, stream);
}
void add_layer_norm_forward(bf16* y, float* sum, float* mean, float* rstd, const float* x,
                            const bf16* res, std::int64_t res_rows, const float* w,
                            const float* b, std::int64_t rows, std::int64_t cols, float eps,
                            cudaStream_t stream) {
  launch_add_forward<float, bf16, bf16>(y, sum, mean, rstd, x, res, res_rows, w, b, rows, cols,
                                        eps, stream);
}
template <class S>
void layer_norm_backward_input(S* dx, const S* dy, const S* x, const float* mean,
                               const float* rstd, const S* w, std::int64_t rows, std::int64_t cols,
                               bool accumulate, cudaStream_t stream) {
  launch_backward_input<S, S>(dx, dy, x, mean, rstd, w, rows, cols, accumulate, stream);
}
void layer_norm_backward_input(float* dx, const bf16* dy, const float* x, const float* mean,
                               const float* rstd, const float* w, std::int64_t rows,
                               std::int64_t cols, bool accumulate, cudaStream_t stream) {
  launch_backward_input<float, bf16>(dx, dy, x, mean, rstd, w, rows, cols, accumulate, stream);
}
std::int64_t layer_norm_params_workspace(std::int64_t rows, std::int64_t cols) {
  const std::int64_t slices = row_slices(rows);
  return slices > 1 ? 2 * slices * cols : 0;
}

template <class S>
void layer_norm_backward_params(S* dw, S* db, const S* dy, const S* x, const float* mean,
                                const float* rstd, std::int64_t rows, std::int64_t cols,
                                bool accumulate_w, bool accumulate_b, float* workspace,
                                cudaStream_t stream) {
  launch_backward_params<S, S>(dw, db, dy, x, mean, rstd, rows, cols, accumulate_w, accumulate_b,
                               workspace, stream);
}
void layer_norm_backward_params(float* dw, float* db, const bf16* dy, const float* x,
                                const float* mean, const float* rstd, std::int64_t rows,
                                std::int64_t cols, bool accumulate_w, bool accumulate_b,
                                float* workspace, cudaStream_t stream) {
  launch_backward_params<float, bf16>(dw, db, dy, x, mean, rstd, rows, cols, accumulate_w,
                                      accumulate_b, workspace, stream);
}
template <class S>
void embedding_forward(S* y, const S* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t dim, cudaStream_t stream) {
  embedding_forward_kernel<S><<<grid_for(n * dim), kThreads, 0, stream>>>(y, table, ids, n, vocab,
                                                                          dim);
  GW_LAUNCH_CHECK();
}
std::int64_t embedding_backward_workspace(DType dtype, std::int64_t vocab, std::int64_t dim) {
  return dtype == DType::kBFloat16 ? vocab * dim : 0;
}
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, float* /*workspace*/,
                        cudaStream_t stream) {
  if (!accumulate) {
    GW_CUDA_CHECK(
        cudaMemsetAsync(dtable, 0, static_cast<std::size_t>(vocab * dim) * sizeof(float), stream));
  }
  embedding_backward_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(dtable, dy, ids, n, vocab,
                                                                        dim);
  GW_LAUNCH_CHECK();
}
void embedding_backward(bf16* dtable, const bf16* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, float* workspace,
                        cudaStream_t stream) {
  // Zeroed by a kernel, not cudaMemsetAsync: compute-sanitizer's initcheck does not see a
  // captured graph's memset nodes write, and reported every read of the sums as uninitialized.
  fill(workspace, 0.f, vocab * dim, stream);
  embedding_backward_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(workspace, dy, ids, n,
                                                                        vocab, dim);
  GW_LAUNCH_CHECK();
  embedding_backward_round_kernel<<<grid_for(vocab * dim), kThreads, 0, stream>>>(
      dtable, workspace, vocab * dim, accumulate);
  GW_LAUNCH_CHECK();
}

#define GW_NORM_INSTANTIATE(S)                                                                    \
  template void layer_norm_forward<S>(S*, float*, float*, const S*, const S*, const S*,          \
                                      std::int64_t, std::int64_t, float, cudaStream_t);         \
  template void add_layer_norm_forward<S>(S*, S*, float*, float*, const S*, const S*,            \
                                          std::int64_t, const S*, const S*, std::int64_t,       \
                                          std::int64_t, float, cudaStream_t);                   \
  template void layer_norm_backward_input<S>(S*, const S*, const S*, const float*, const float*, \
                                             const S*, std::int64_t, std::int64_t, bool,         \
                                             cudaStream_t);                                      \
  template void layer_norm_backward_params<S>(S*, S*, const S*, const S*, const float*,          \
                                              const float*, std::int64_t, std::int64_t, bool,    \
                                              bool, float*, cudaStream_t);                       \
  template void embedding_forward<S>(S*, const S*, const std::int32_t*, std::int64_t,            \
                                     std::int64_t, std::int64_t, cudaStream_t);
GW_NORM_INSTANTIATE(float)
GW_NORM_INSTANTIATE(bf16)
#undef GW_NORM_INSTANTIATE

}  // namespace graphward::kernels
