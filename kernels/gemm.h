#pragma once
// GEMM: C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C, all row-major.
// CUDA: cuBLAS SGEMM, fp32 (TF32 only where asked: gemm_ex). CPU reference: naive, accumulating
// in double.
// beta = 0 writes C (C may hold garbage, even NaN), beta = 1 accumulates into it.
//
// op(A) is A stored [m,k] (trans_a = false) or Aᵀ with A stored [k,m] (trans_a = true); same for B.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

// ReLU's bit mask for a row-major C [m, n]: each row padded to a multiple of 128 bits (cuBLASLt's
// leading-dimension rule), m rows.
constexpr std::int64_t relu_mask_ld(std::int64_t n) {
  return (n + 127) / 128 * 128;
}
constexpr std::int64_t relu_mask_bytes(std::int64_t m, std::int64_t n) {
  return relu_mask_ld(n) / 8 * m;
}

#if GRAPHWARD_HAS_CUDA
// A cuBLAS handle and the workspace it must use on one stream. The launcher calls
// cublasSetStream and then cublasSetWorkspace: setting the stream resets the workspace to cuBLAS's
// own pool, which would allocate inside a stream capture (docs/DESIGN.md, "A trap").
// A handle that is already bound to a stream with its workspace (bound_stream) skips both calls
// on that stream: they cost host time on every GEMM.
struct BlasContext {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t bound_stream = nullptr;  // the stream the handle is bound to, if any
};

void gemm(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c,
          cudaStream_t stream);
// `batch` GEMMs back to back (1: one GEMM) through cublasGemmStridedBatchedEx, where cuBLASLt
// offers no algorithm: bfloat16 A, B, C (`bf16`; with `f32_out` C float32) with float32
// arithmetic, or float32 ones multiplied as TF32 (`tf32`, Note [TF32], engine/runtime/math_mode.h).
void gemm_ex(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
             std::int64_t k, std::int64_t batch, float alpha, const void* a, const void* b,
             float beta, void* c, bool bf16, bool tf32, cudaStream_t stream, bool f32_out = false);
// `batch` GEMMs of contiguous matrices back to back (cublasSgemmStridedBatched).
void gemm_batched(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const float* a,
                  const float* b, float beta, float* c, cudaStream_t stream);

// An epilogue (row-major terms of gemm(), beta = 0). Forward: C = act(op(A)·op(B) + bias), the
// bias [n] added to every row. kGeluAux also writes the pre-activation op(A)·op(B) + bias into
// `aux` ([m, n], row-major, like C): what GELU's backward reads. kReluAux writes ReLU's bit mask
// into `aux` (relu_mask_bytes(m, n) bytes, cuBLASLt's layout: a row of C per relu_mask_ld(n)
// bits). GELU is the tanh approximation. Backward (Note [Backward epilogue fusion]): kDRelu /
// kDGelu write C = (op(A)·op(B)) ⊙ act'(·), act' read from a forward's `aux` (the bit mask / the
// pre-activation).
enum class Epilogue : std::uint8_t {
  kNone,
  kBias,
  kRelu,
  kBiasRelu,
  kGeluAux,
  kBiasGeluAux,
  kReluAux,
  kBiasReluAux,
  kDRelu,
  kDGelu,
};
constexpr bool epilogue_has_bias(Epilogue e) {
  return e == Epilogue::kBias || e == Epilogue::kBiasRelu || e == Epilogue::kBiasGeluAux ||
         e == Epilogue::kBiasReluAux;
}
constexpr bool epilogue_has_aux(Epilogue e) {
  return e == Epilogue::kGeluAux || e == Epilogue::kBiasGeluAux || e == Epilogue::kReluAux ||
         e == Epilogue::kBiasReluAux || e == Epilogue::kDRelu || e == Epilogue::kDGelu;
}
// The aux is ReLU's bit mask (else a matrix laid out like C).
constexpr bool epilogue_relu_mask(Epilogue e) {
  return e == Epilogue::kReluAux || e == Epilogue::kBiasReluAux || e == Epilogue::kDRelu;
}
// A backward epilogue: reads the aux.
constexpr bool epilogue_is_backward(Epilogue e) {
  return e == Epilogue::kDRelu || e == Epilogue::kDGelu;
}
// What a cuBLASLt plan may fuse into its epilogue and which algorithms it may pick.
struct LtOptions {
  // Also writes bias_grad[m] = Σ_k op(A)[i, k] (row-major terms of gemm(); cuBLASLt's BGRADB,
  // since our A is cuBLASLt's B): a linear layer's bias gradient fused into its weight-gradient
  // GEMM. The bias gradient is written, never accumulated, whatever beta is.
  bool bias_grad_a = false;
  // Allow split-K algorithms (a second, reduction kernel on some): the heuristic's first choice.
  // Without: the same choice with its split removed (one kernel), where cuBLASLt accepts that.
  bool split_k = true;
  // An epilogue (not with bias_grad_a).
  Epilogue epilogue = Epilogue::kNone;
  // Batched: `batch` independent GEMMs over contiguous matrices (A, B and C each hold `batch`
  // matrices back to back), one launch. Not with an epilogue or a bias gradient.
  std::int64_t batch = 1;
  // bfloat16 storage for A, B, C, the bias, the bias gradient and the aux; float32 arithmetic.
  bool bf16 = false;
  // With bf16: C and the bias gradient float32 instead (bfloat16 products summed and stored in
  // float32: a float32 parameter's gradient from its bfloat16 copy, Note [Autocast]). Plain GEMMs
  // and the bias gradient only.
  bool f32_out = false;
  // float32 storage multiplied as TF32 (CUBLAS_COMPUTE_32F_FAST_TF32; Note [TF32],
  // engine/runtime/math_mode.h). Not with bf16.
  bool tf32 = false;
  bool operator==(const LtOptions&) const = default;
};

// Times GPU work: time_us(stream, launch) is the GPU time of one `launch()` on `stream`, µs —
// three launches queued behind a kernel that holds the stream until all are enqueued (so the
// host's enqueue gaps are not timed), the best of three trials; infinite where `launch` returns
// false. Synchronizes `stream`; not inside a capture. Owns the hold's flag (mapped pinned host
// memory) and two timing events, made once for all the timings of a GEMM's first use.
class LaunchTimer {
 public:
  LaunchTimer();
  ~LaunchTimer();
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;
  double time_us(cudaStream_t stream, const std::function<bool()>& launch);

 private:
  void set(unsigned v);
  void release() noexcept;
  unsigned* flag_ = nullptr;         // host
  unsigned* device_flag_ = nullptr;  // the same, as the device reads it
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

// One GEMM shape through cuBLASLt, planned once: the operation and layout descriptors and the
// algorithm (cublasLtMatmulAlgoGetHeuristic, fp32 compute, TF32 only where LtOptions says) are made
// at construction and reused by every run(), which is then a single cublasLtMatmul call —
// cublasSgemm repeats its heuristics on every call, which dominates the host time of a small GEMM.
// Same layout contract as gemm(). Pointers passed to run() must be aligned to at least `alignment`
// bytes (the planner asked the heuristic for algorithms that accept that). Move-only; one thread at
// a time.
class LtGemm {
 public:
  LtGemm(cublasLtHandle_t handle, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
         std::int64_t k, std::size_t workspace_bytes, unsigned alignment, LtOptions options = {});
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // False when the heuristic offered no algorithm: use gemm() (and a reduction) instead.
  bool usable() const { return usable_; }
  // bias_grad: the [m] output of LtOptions::bias_grad_a (required then, ignored otherwise);
  // bias ([n]) and aux: the epilogue's (required where it has them, ignored otherwise; a backward
  // epilogue only reads the aux).
  // The pointers are float32 or bfloat16 data, as LtOptions::bf16 says.
  void run(float alpha, const void* a, const void* b, float beta, void* c, void* workspace,
           std::size_t workspace_bytes, cudaStream_t stream, void* bias_grad = nullptr,
           const void* bias = nullptr, void* aux = nullptr);
  // The chosen algorithm, readable: "algo 6 tile 11 stages 8 splitK 1 reduction none ...".
  std::string describe() const;
  // Candidate i (0 <= i < candidates()), readable as describe() says.
  std::string describe(int candidate) const;

  // The heuristic's candidates (up to 8, its order; the first is its choice and the plan's until
  // use() or tune() says otherwise), each one kernel where LtOptions::split_k is off; and there,
  // after them, one-kernel splits of k and the heuristic's splits with their reduction kernel
  // (up to 24 in all).
  int candidates() const { return n_candidates_; }
  // Runs candidate i from now on.
  void use(int candidate);
  // The algorithm run() launches, and another plan's choice for the same GEMM to launch instead.
  const cublasLtMatmulAlgo_t& algo() const { return algo_; }
  void use(const cublasLtMatmulAlgo_t& algo) { algo_ = algo; }
  // From now on not usable(): the caller's separate kernels run instead (they were timed faster).
  void decline() { usable_ = false; }
  // Times every candidate on `stream` with run()'s arguments (`timer`) and runs the fastest from
  // now on:
  // the heuristic's choice unless another is more than 3% faster. Every candidate writes c (and
  // bias_grad, and a forward epilogue's aux): pass scratch memory for them, with the values beta
  // reads. Synchronizes `stream`; not inside a stream capture.
  struct Timing {
    int chosen = 0;        // the index use() takes
    double first_us = 0;   // the heuristic's choice, µs a launch
    double chosen_us = 0;  // the chosen one
    std::vector<double> candidate_us;  // every candidate's, in candidates' order (inf: no launch)
  };
  Timing tune(LaunchTimer& timer, float alpha, const void* a, const void* b, float beta, void* c,
              void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
              void* bias_grad = nullptr, const void* bias = nullptr, void* aux = nullptr);

 private:
  void release() noexcept;
  // The constructor's parts: the epilogue's attributes on desc_; the three matrix layouts
  // (cuBLASLt's column-major view: `na`, `nb` whether its A and B are untransposed); the
  // heuristic's candidates.
  void set_epilogue(cudaDataType_t type, std::int64_t n);
  void make_layouts(cudaDataType_t type, bool na, bool nb, std::uint64_t mm, std::uint64_t nn,
                    std::uint64_t kk);
  void find_candidates(unsigned alignment, std::int64_t k);
  std::string describe_algo(const cublasLtMatmulAlgo_t& algo) const;
  cublasLtMatmulAlgo_t unsplit(const cublasLtMatmulAlgo_t& algo) const;
  // `algo` with k split `split` ways and the parts added in C in turn (one kernel), where
  // cuBLASLt accepts that within the workspace.
  std::optional<cublasLtMatmulAlgo_t> split_in_place(const cublasLtMatmulAlgo_t& algo,
                                                     std::int32_t split) const;
  cublasStatus_t launch(const cublasLtMatmulAlgo_t& algo, float alpha, const void* a, const void* b,
                        float beta, void* c, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream, void* bias_grad, const void* bias, void* aux);
  cublasLtHandle_t handle_;
  LtOptions options_;
  std::size_t workspace_bytes_ = 0;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  static constexpr int kMaxCandidates = 24;
  // What tune() adds to the time of a candidate with a reduction kernel apart: the host time of
  // its second launch in an eager step, µs (docs/DECISIONS.md, "small GEMMs may split k").
  static constexpr double kReduceApartUs = 1.5;
  cublasLtMatmulAlgo_t candidates_[kMaxCandidates]{};  // (a std::vector of them trips nvcc 13.0)
  int n_candidates_ = 0;
  const void* bias_ = nullptr;  // the bias pointer currently set on desc_
  void* aux_ = nullptr;         // the epilogue's aux pointer currently set on desc_
  // What a launch writes, in bytes (Note [GEMM outputs and initcheck], kernels/gemm.cu): C (every
  // matrix of a batch), the fused bias gradient, the epilogue's aux matrix.
  std::size_t c_bytes_ = 0, bias_grad_bytes_ = 0, aux_bytes_ = 0;
  bool usable_ = false;
};
#endif

namespace cpu {
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, const T* b, T beta, T* c);
// `batch` gemm()s of contiguous matrices back to back.
template <class T>
void gemm_batched(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  std::int64_t batch, T alpha, const T* a, const T* b, T beta, T* c);
}  // namespace cpu

}  // namespace graphward::kernels
