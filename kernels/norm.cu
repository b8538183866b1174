// Layer-norm and embedding kernels. Contract in norm.h. Layer norm: one block of 256 threads per
// row, sums reduced in a fixed tree; the parameter gradients by column blocks (32 columns x 8 row
// slices), combined in a fixed order: deterministic. The embedding gradient adds with atomics.
#include <cmath>

#include "kernels/block_reduce.cuh"
#include "kernels/launch.cuh"
#include "kernels/norm.h"

namespace graphward::kernels {
namespace {
using detail::block_reduce;
using detail::grid_for;
using detail::kThreads;
using detail::store;

constexpr int kRowThreads = 256;

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

__global__ void layer_norm_backward_params_kernel(float* dw, float* db, const float* dy,
                                                  const float* x, const float* mean,
                                                  const float* rstd, std::int64_t rows,
                                                  std::int64_t cols, bool accumulate_w,
                                                  bool accumulate_b) {
  __shared__ float pw[8][33], pb[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float aw = 0.f, ab = 0.f;
  if (col < cols) {
    for (std::int64_t r = threadIdx.y; r < rows; r += 8) {
      const std::int64_t i = r * cols + col;
      aw += dy[i] * (x[i] - mean[r]) * rstd[r];
      ab += dy[i];
    }
  }
  pw[threadIdx.y][threadIdx.x] = aw;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float tw = 0.f, tb = 0.f;
    for (int s = 0; s < 8; ++s) {
      tw += pw[s][threadIdx.x];
      tb += pb[s][threadIdx.x];
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
  layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      y, mean, rstd, x, w, b, cols, eps);
  GW_LAUNCH_CHECK();
}
void layer_norm_backward_input(float* dx, const float* dy, const float* x, const float* mean,
                               const float* rstd, const float* w, std::int64_t rows,
                               std::int64_t cols, bool accumulate, cudaStream_t stream) {
  layer_norm_backward_input_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      dx, dy, x, mean, rstd, w, cols, accumulate);
  GW_LAUNCH_CHECK();
}
void layer_norm_backward_params(float* dw, float* db, const float* dy, const float* x,
                                const float* mean, const float* rstd, std::int64_t rows,
                                std::int64_t cols, bool accumulate_w, bool accumulate_b,
                                cudaStream_t stream) {
  const dim3 block(32, 8);
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  layer_norm_backward_params_kernel<<<blocks, block, 0, stream>>>(dw, db, dy, x, mean, rstd, rows,
                                                                  cols, accumulate_w, accumulate_b);
  GW_LAUNCH_CHECK();
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
    GW_CUDA_CHECK(cudaMemsetAsync(dtable, 0, static_cast<std::size_t>(vocab * dim) * sizeof(float),
                                  stream));
  }
  embedding_backward_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(dtable, dy, ids, n, vocab,
                                                                        dim);
  GW_LAUNCH_CHECK();
}

}  // namespace graphward::kernels
