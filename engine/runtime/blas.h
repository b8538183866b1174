#pragma once
// cuBLAS handles for the calling thread: one per (thread, device, stream), created on first use
// with TF32 off (fp32 GEMMs are true fp32 unless set_matmul_tf32 says otherwise: Note [TF32],
// engine/runtime/math_mode.h), bound once to its stream and to a workspace of its own
// (32 MiB, the size cuBLAS recommends for Hopper), and destroyed at thread exit. cuBLAS handles
// must not be used by two threads at once; GEMMs on two streams never share scratch memory; no GEMM
// ever asks cuBLAS to allocate (workspaces are allocated outside any capture, on a stream's first
// GEMM); and no GEMM pays host time for cublasSetStream/cublasSetWorkspace. Streams are never
// destroyed (Note [Stream lifetime], stream.cpp), so a handle keyed by a stream never outlives it.
#include <cstddef>
#include <cstdint>
#include "graphward/base/config.h"

#include "graphward/base/dtype.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"

#if GRAPHWARD_HAS_CUDA
#include "graphward/kernels/gemm.h"
#endif

namespace graphward {

inline constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;
// Whether graphward's GEMMs may use the heuristic's split-K choice. Not for small GEMMs
// (m·n·k ≤ 2^24), whose GPU time is within a launch: there the split's second (reduction) kernel
// costs more host and GPU time than it saves; larger ones need their split (docs/DECISIONS.md,
// "split-K only above 2^24 multiply-adds"; bench/ops_bench.cpp, LtGemm).
constexpr bool gemm_allows_split_k(std::int64_t m, std::int64_t n, std::int64_t k) {
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) > 16777216.0;
}

#if GRAPHWARD_HAS_CUDA
// The calling thread's cuBLAS handle for `device` with the workspace of `stream`.
kernels::BlasContext blas_context(Device device, cudaStream_t stream);
// Whether blas_context(device, stream) was made on the calling thread (it makes nothing).
bool has_blas_context(Device device, cudaStream_t stream) noexcept;

// Row-major C[m,n] = alpha·op(A)·op(B) + beta·C on `stream` (layout of kernels/gemm.h), through
// cuBLASLt with a plan per (shape, transposes, pointer alignment) made on first use and cached
// per thread and device; runs cuBLAS SGEMM instead where cuBLASLt offers no algorithm or SGEMM was
// timed faster (Note [Choosing a GEMM algorithm], blas.cpp). fp32; TF32 where matmul_tf32() (read
// at each call, a plan per setting). The first GEMM of a
// shape pays for the heuristic and the timing (outside any capture: warm up first).
void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b, float beta,
          float* c);
// bfloat16 storage, float32 arithmetic (cublasGemmEx where cuBLASLt offers no algorithm). The
// bfloat16 forms of gemm_bias_grad and gemm_epilogue below likewise (bias, gradient, aux: bf16).
void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b, float beta,
          bf16* c);
// bfloat16 A and B, float32 C: the products summed in float32 and stored unrounded (a float32
// parameter's gradient from its bfloat16 copy's operands, Note [Autocast]). The float32-C form of
// gemm_bias_grad below likewise (the bias gradient float32 too).
void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b, float beta,
          float* c);

// `batch` gemm()s of contiguous matrices back to back (A, B and C each hold `batch` matrices),
// in one cuBLASLt launch (cublasSgemmStridedBatched where cuBLASLt offers no algorithm).
void gemm_batched(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const float* a,
                  const float* b, float beta, float* c);
void gemm_batched(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const bf16* a,
                  const bf16* b, float beta, bf16* c);

// gemm(), and also bias_grad[m] = Σ_k op(A)[i, k] written (never accumulated) by the same kernel
// (cuBLASLt's bias-gradient epilogue): a linear layer's weight gradient dW = dYᵀ·X with its bias
// gradient Σ_rows dY. Returns false, having launched nothing, where cuBLASLt offers no algorithm
// for the fused epilogue or gemm() and a column sum were timed faster: then run those instead.
bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b,
                    float beta, float* c, float* bias_grad);
bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b,
                    float beta, bf16* c, bf16* bias_grad);
bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b,
                    float beta, float* c, float* bias_grad);

// C[m,n] = act(op(A)·op(B) + bias) in one cuBLASLt kernel (kernels::Epilogue: the bias [n] added
// to every row; kGeluAux also writes the pre-activation into aux [m,n], kReluAux ReLU's bit mask,
// kernels::relu_mask_bytes(m, n) bytes). Returns false, having launched nothing, where cuBLASLt
// offers no algorithm for the epilogue (GELU's aux needs n to be a multiple of 8): then run gemm()
// and the bias and activation kernels instead.
bool gemm_epilogue(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const float* a, const float* b, float* c,
                   kernels::Epilogue epilogue, const float* bias = nullptr, void* aux = nullptr);
bool gemm_epilogue(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const bf16* a, const bf16* b, bf16* c,
                   kernels::Epilogue epilogue, const bf16* bias = nullptr, void* aux = nullptr);

// Note [Backward epilogue fusion]: C[m,n] = (op(A)·op(B)) ⊙ act'(·) in one cuBLASLt kernel —
// `epilogue` kDRelu (aux: the forward's ReLU bit mask) or kDGelu (aux: the forward's
// pre-activation, [m, n]). Returns false, having launched nothing, where cuBLASLt offers no
// algorithm.
bool gemm_act_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const float* a, const float* b, float* c,
                   kernels::Epilogue epilogue, const void* aux);
bool gemm_act_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const bf16* a, const bf16* b, bf16* c,
                   kernels::Epilogue epilogue, const void* aux);
#endif

}  // namespace graphward
