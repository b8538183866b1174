#pragma once
// Layer normalization over the last dimension of a [rows, cols] matrix, forward and backward, and
// the embedding lookup with its gradient, with CPU references. Same launcher contract as
// elementwise.h.
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// S: float or bf16 — x, y, w, b and their gradients (bfloat16 storage: loads widened, arithmetic
// and the row statistics in float32, each output rounded once when stored); mean and rstd are
// float32 either way.
// y = (x − mean) · rstd · w + b per row (w, b: [cols]; b may be null); writes mean and rstd [rows]
// (rstd = 1 / √(var + eps), the biased variance). Row sums in a fixed order: deterministic.
template <class S>
void layer_norm_forward(S* y, float* mean, float* rstd, const S* x, const S* w, const S* b,
                        std::int64_t rows, std::int64_t cols, float eps, cudaStream_t stream);
// sum = x + res (elementwise, rounded as binary_forward's add rounds it; row r of x takes row
// r % res_rows of res [res_rows, cols]), then layer_norm_forward of sum (as stored) into y, mean
// and rstd: the same bits as the two launches. Rows of at most 1024 columns in one kernel (x and
// res read once); wider rows in the two.
template <class S>
void add_layer_norm_forward(S* y, S* sum, float* mean, float* rstd, const S* x, const S* res,
                            std::int64_t res_rows, const S* w, const S* b, std::int64_t rows,
                            std::int64_t cols, float eps, cudaStream_t stream);
// dx = rstd · (g − mean_j(g) − x̂ · mean_j(g · x̂)) with g = dy · w, x̂ = (x − mean) · rstd
template <class S>
void layer_norm_backward_input(S* dx, const S* dy, const S* x, const float* mean,
                               const float* rstd, const S* w, std::int64_t rows, std::int64_t cols,
                               bool accumulate, cudaStream_t stream);
// dw = Σ_rows dy · x̂, db = Σ_rows dy (either may be null); a fixed order: deterministic.
// In two passes for many rows: partial sums over slices of rows into `workspace` (at least
// layer_norm_params_workspace(rows, cols) floats; unused when that is 0), then their sum in a
// fixed order — parallel over rows and columns, deterministic.
template <class S>
void layer_norm_backward_params(S* dw, S* db, const S* dy, const S* x, const float* mean,
                                const float* rstd, std::int64_t rows, std::int64_t cols,
                                bool accumulate_w, bool accumulate_b, float* workspace,
                                cudaStream_t stream);
std::int64_t layer_norm_params_workspace(std::int64_t rows, std::int64_t cols);
// The same four with float32 x (and sum, w, b, dx, dw, db) and a bfloat16 y and dy (Note
// [Autocast]: a layer norm's normalized output in bfloat16 for the matrix product it feeds, its
// gradient read from that product's bfloat16 backward): float32 arithmetic, y rounded once when
// stored, dy widened when loaded — the bits of the float32 forms followed (preceded) by a cast.
void layer_norm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, std::int64_t rows, std::int64_t cols, float eps,
                        cudaStream_t stream);
void add_layer_norm_forward(bf16* y, float* sum, float* mean, float* rstd, const float* x,
                            const float* res, std::int64_t res_rows, const float* w,
                            const float* b, std::int64_t rows, std::int64_t cols, float eps,
                            cudaStream_t stream);
// The same with a bfloat16 res (Note [Autocast]: a matrix product's output added to a float32
// residual stream), widened as it is read: the bits of its cast to float32 then the form above.
void add_layer_norm_forward(bf16* y, float* sum, float* mean, float* rstd, const float* x,
                            const bf16* res, std::int64_t res_rows, const float* w,
                            const float* b, std::int64_t rows, std::int64_t cols, float eps,
                            cudaStream_t stream);
void layer_norm_backward_input(float* dx, const bf16* dy, const float* x, const float* mean,
                               const float* rstd, const float* w, std::int64_t rows,
                               std::int64_t cols, bool accumulate, cudaStream_t stream);
void layer_norm_backward_params(float* dw, float* db, const bf16* dy, const float* x,
                                const float* mean, const float* rstd, std::int64_t rows,
                                std::int64_t cols, bool accumulate_w, bool accumulate_b,
                                float* workspace, cudaStream_t stream);
// y[i, :] = table[ids[i], :] for i < n (ids outside [0, vocab) give a row of NaN).
template <class S>
void embedding_forward(S* y, const S* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t dim, cudaStream_t stream);
// dtable[ids[i], :] += dy[i, :], deterministic: each row's contributions added in position order
// (Note [Deterministic embedding gradient], kernels/norm.cu), float32 bitwise the CPU reference's;
// a bfloat16 table's row summed in float32 and rounded once. dtable is written first unless
// `accumulate` (zeroed, then added to). `workspace`: `workspace_bytes` =
// embedding_backward_workspace(n, vocab) bytes (the ids sorted with their positions; none for
// n = 0).
std::int64_t embedding_backward_workspace(std::int64_t n, std::int64_t vocab);
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, void* workspace,
                        std::int64_t workspace_bytes, cudaStream_t stream);
void embedding_backward(bf16* dtable, const bf16* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate, void* workspace,
                        std::int64_t workspace_bytes, cudaStream_t stream);
#endif

namespace cpu {
// The backward recomputes each row's mean from x in double, as the forward computed it (`mean`,
// the forward's rounded output, is not read): x̂ is then the forward's at any magnitude.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b,
                        std::int64_t rows, std::int64_t cols, T eps);
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* mean,
                         const T* rstd, const T* w, std::int64_t rows, std::int64_t cols,
                         bool accumulate_x, bool accumulate_w, bool accumulate_b);
template <class T>
void embedding_forward(T* y, const T* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t dim);
template <class T>
void embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::int64_t n,
                        std::int64_t vocab, std::int64_t dim, bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
