// Layer-norm and embedding kernels. Contract in norm.h. Layer norm: rows of at most 1024 columns
// one warp a row (8 rows a block), the row held in registers (x read once), sums reduced by
// butterfly shuffles in a fixed order; wider rows one block of 256 threads a row, sums reduced in
// a fixed tree (the choice is the shape's alone, so a shape's bits never depend on its addresses);
// the parameter gradients by blocks of 32 columns x 128 rows, whose partial sums are then added in
// slice order: deterministic. The embedding gradient sorts the ids (CUB's radix sort, stable) and
// adds each row's contributions in position order: deterministic, and the CPU reference's sums
// bitwise in float32 (Note [Deterministic embedding gradient]).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

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

// Note [Deterministic embedding gradient]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dtable[ids[i], :] += dy[i, :] with atomic adds would order a repeated id's contributions by
// the hardware's schedule: its gradient's last bits, and with them a whole training run, would
// vary run to run, and a checkpointed run resumed would not be the run uninterrupted. Instead
// the ids are sorted with their positions (CUB's LSD radix sort: stable, so equal ids keep their
// positions ascending) and one block a run of equal ids adds the run's dy rows in position
// order, each thread a column: the CPU reference's order exactly (kernels/norm_cpu.cpp adds row
// by row), so float32 gradients are the CPU's bitwise; a bfloat16 table's row is summed in
// float32 and rounded once. An id outside [0, vocab) is keyed `vocab` (sorted last, skipped).
// The sort reads keys of only as many bits as `vocab` needs, ping-ponging between two buffers. A run is added by one thread a
// column in sequence (a thread a column, up to 1024 columns a block): a token repeated r times
// costs r dependent adds a column, its loads independent and issued eight ahead — the order the
// CPU's bits need, and the cost llm.c's deterministic encoder backward pays the same way (a run
// a bucket, its items in sequence).
int embedding_key_bits(std::int64_t vocab) {
  int bits = 1;
  while ((std::int64_t{1} << bits) <= vocab) ++bits;  // keys run up to vocab itself
  return bits;
}

// Also zeroes the sort's own scratch (`scratch_words`): CUB zeroes its counters with
// cudaMemsetAsync, a memset node in a captured graph, whose writes compute-sanitizer's initcheck
// does not see; written here first, CUB's reads of them are not reported as uninitialized.
__global__ void embedding_keys_kernel(std::uint32_t* keys, std::uint32_t* positions,
                                      const std::int32_t* ids, std::int64_t n, std::int64_t vocab,
                                      std::uint32_t* scratch, std::int64_t scratch_words) {
  GW_GRID_STRIDE(i, n > scratch_words ? n : scratch_words) {
    if (i < n) {
      const std::int32_t id = ids[i];
      keys[i] = static_cast<std::uint32_t>((id >= 0 && id < vocab) ? id : vocab);
      positions[i] = static_cast<std::uint32_t>(i);
    }
    if (i < scratch_words) scratch[i] = 0;
  }
}

// Block b takes the run of equal sorted keys that starts at b (the blocks at other places return
// at once); dtable is already zero where the gradient is written, not added to.
template <class T>
__global__ void embedding_rows_kernel(T* dtable, const T* dy, const std::uint32_t* keys,
                                      const std::uint32_t* positions, std::int64_t n,
                                      std::int64_t vocab, std::int64_t dim) {
  const std::int64_t start = blockIdx.x;
  const std::uint32_t key = keys[start];
  if (key >= vocab || (start > 0 && keys[start - 1] == key)) return;  // the whole block returns
  // The run's end, found by the block together (a blockDim of keys at a time).
  __shared__ int run_end;
  if (threadIdx.x == 0) run_end = static_cast<int>(n);
  __syncthreads();
  for (std::int64_t from = start + 1; from < n; from += blockDim.x) {
    const std::int64_t r = from + threadIdx.x;
    if (r < n && keys[r] != key) atomicMin(&run_end, static_cast<int>(r));
    __syncthreads();
    const bool found = run_end < n;
    __syncthreads();  // every thread has read run_end before the next round may lower it
    if (found) break;
  }
  const std::int64_t end = run_end;
  const std::int64_t row = static_cast<std::int64_t>(key) * dim;
  for (std::int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    if constexpr (std::is_same_v<T, float>) {
      float v = dtable[row + j];
#pragma unroll 8
      for (std::int64_t r = start; r < end; ++r) {
        v = __fadd_rn(v, dy[static_cast<std::int64_t>(positions[r]) * dim + j]);
      }
      dtable[row + j] = v;
    } else {
      float v = 0.f;
#pragma unroll 8
      for (std::int64_t r = start; r < end; ++r) {
        v = __fadd_rn(v, load(dy, static_cast<std::int64_t>(positions[r]) * dim + j));
      }
      put(dtable, row + j, v, /*accumulate=*/true);
    }
  }
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
namespace {
// The sort's scratch: keys and positions, in and out (each 256-byte aligned), then CUB's own.
std::size_t aligned_words(std::int64_t n) {
  return (static_cast<std::size_t>(n) * sizeof(std::uint32_t) + 255) / 256 * 256;
}
// CUB's sort counts its items in an int.
void check_sort_size(std::int64_t n) {
  GW_CHECK(n <= std::int64_t{0x7fffffff}, "embedding_backward: ", n,
           " ids; expected at most 2^31 - 1");
}
std::size_t cub_sort_bytes(std::int64_t n, std::int64_t vocab) {
  check_sort_size(n);
  std::size_t bytes = 0;
  cub::DoubleBuffer<std::uint32_t> keys(nullptr, nullptr), positions(nullptr, nullptr);
  GW_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, positions,
                                                static_cast<int>(n), 0,
                                                embedding_key_bits(vocab)));
  return (bytes + 3) / 4 * 4;
}

template <class T>
void launch_embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::int64_t n,
                               std::int64_t vocab, std::int64_t dim, bool accumulate,
                               void* workspace, std::int64_t workspace_bytes,
                               cudaStream_t stream) {
  // Zeroed by a kernel, not cudaMemsetAsync: compute-sanitizer's initcheck does not see a
  // captured graph's memset nodes write.
  check_sort_size(n);  // before anything is written
  if (!accumulate) fill(dtable, 0.f, vocab * dim, stream);
  if (n == 0 || dim == 0) return;
  auto* base = static_cast<unsigned char*>(workspace);
  const std::size_t a = aligned_words(n);
  // Keys and positions in two buffers each, the sort ping-ponging between them (DoubleBuffer:
  // no copies of its own); CUB's scratch after them.
  cub::DoubleBuffer<std::uint32_t> keys(reinterpret_cast<std::uint32_t*>(base),
                                        reinterpret_cast<std::uint32_t*>(base + a));
  cub::DoubleBuffer<std::uint32_t> positions(reinterpret_cast<std::uint32_t*>(base + 2 * a),
                                             reinterpret_cast<std::uint32_t*>(base + 3 * a));
  // CUB's share of the workspace, as embedding_backward_workspace sized it (not asked again).
  GW_CHECK(workspace_bytes >= static_cast<std::int64_t>(4 * a), "embedding_backward: a ",
           workspace_bytes, "-byte workspace; expected embedding_backward_workspace(n, vocab)");
  std::size_t sort_bytes = static_cast<std::size_t>(workspace_bytes) - 4 * a;
  auto* sort_scratch = reinterpret_cast<std::uint32_t*>(base + 4 * a);
  const auto sort_words = static_cast<std::int64_t>(sort_bytes / 4);
  embedding_keys_kernel<<<grid_for(n > sort_words ? n : sort_words), kThreads, 0, stream>>>(
      keys.Current(), positions.Current(), ids, n, vocab, sort_scratch, sort_words);
  GW_LAUNCH_CHECK();
  GW_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, keys, positions,
                                                static_cast<int>(n), 0,
                                                embedding_key_bits(vocab), stream));
  // A thread a column (up to 1024 a block): a run's rows are read once, coalesced.
  const int threads = dim >= 1024 ? 1024 : static_cast<int>((dim + 31) / 32 * 32);
  embedding_rows_kernel<T><<<static_cast<unsigned>(n), threads, 0, stream>>>(
      dtable, dy, keys.Current(), positions.Current(), n, vocab, dim);
  GW_LAUNCH_CHECK();
}
}  // namespace

std::int64_t embedding_backward_workspace(std::int64_t n, std::int64_t vocab) {
  if (n <= 0) return 0;
  return static_cast<std::int64_t>(4 * aligned_words(n) + cub_sort_bytes(n, vocab));
}
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, void* workspace,
                        std::int64_t workspace_bytes, cudaStream_t stream) {
  launch_embedding_backward(dtable, dy, ids, n, vocab, dim, accumulate, workspace,
                            workspace_bytes, stream);
}
void embedding_backward(bf16* dtable, const bf16* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, void* workspace,
                        std::int64_t workspace_bytes, cudaStream_t stream) {
  launch_embedding_backward(dtable, dy, ids, n, vocab, dim, accumulate, workspace,
                            workspace_bytes, stream);
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
