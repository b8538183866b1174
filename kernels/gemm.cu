#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>

#include "graphward/base/error.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/nvtx_mark.h"

#if defined(GRAPHWARD_NVTX) && GRAPHWARD_NVTX && __has_include(<nvtx3/nvToolsExtMemCudaRt.h>)
#define GRAPHWARD_NVTX_MEM 1
#else
#define GRAPHWARD_NVTX_MEM 0
#endif

namespace graphward::kernels {

// Note [GEMM outputs and initcheck]
// compute-sanitizer's initcheck does not see the stores of the GEMM kernels cuBLAS and cuBLASLt
// run on Hopper for bfloat16 (the nvjet kernels, cuBLASLt's algorithm 66, which store their tiles
// through the tensor memory accelerator): to the tool a GEMM's output stays unwritten, and every
// later read of it is reported — graphward's kernels', cuBLASLt's own epilogue kernels', cuDNN's
// (139,455 reports in one run of the bfloat16 transformer example, every one an address a GEMM had
// written; scripts/initcheck_probe.sh shows the same on a bare cuBLASLt program, in every trial).
// cuDNN's fused attention marks its outputs the same way, by its contract: the attention tests
// drew no report without the marks, but once the GEMMs marked theirs the example's remaining
// reports included 2,048 by the first kernel of cuDNN's attention backward, which reads the
// forward's output and its gradient (a marked GEMM's output); the marks rule the former out.
// So each GEMM and each fused attention call tells the tool what it writes — C, a fused
// epilogue's bias gradient and aux matrix; attention's O and statistics, or dQ, dK and dV —
// through NVTX's memory API (nvtxMemCudaMarkInitialized, ordered on the launch's stream):
// the bytes the call writes by its contract and no others, so a read of anything else is still
// reported. Without a tool attached the call is a pointer check; built without NVTX, nothing.
// A user running initcheck on a program that uses graphward gets the same treatment of the
// kernels graphward launches, and no reports of them. The marks are ordered after the call's
// kernels, so a kernel of the call itself that reads what another of its kernels wrote is not
// covered by them: cuBLASLt runs some epilogues as a separate kernel
// (epilogue::impl::globalKernel) reading the product — 50,000 reports of it in one GPT-2 test,
// from gemm_act_grad's GELU-derivative epilogue. A plan with an epilogue and beta = 0 marks C
// before the call instead: with beta = 0 C is read before the product is written only by the
// small-n kernels' harmless loads (scripts/common.sh's known reports), so nothing real is hidden.
void mark_written(const void* p, std::size_t bytes, cudaStream_t stream) {
#if GRAPHWARD_NVTX_MEM
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("graphward");
  nvtx_mark_initialized(domain, p, bytes, stream);
#else
  (void)p, (void)bytes, (void)stream;
#endif
}

void gemm(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c,
          cudaStream_t stream) {
  GW_CHECK(m > 0 && n > 0 && k > 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
           "gemm: sizes m=", m, " n=", n, " k=", k, " must be in [1, INT_MAX]");
  if (blas.bound_stream != stream || stream == nullptr) {
    GW_CUBLAS_CHECK(cublasSetStream(blas.handle, stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(blas.handle, blas.workspace, blas.workspace_bytes));
  }
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  GW_CUBLAS_CHECK(cublasSgemm(blas.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a, lda,
                              &beta, c, static_cast<int>(n)));
  mark_written(c, static_cast<std::size_t>(m * n) * sizeof(float), stream);
}

void gemm_batched(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const float* a,
                  const float* b, float beta, float* c, cudaStream_t stream) {
  GW_CHECK(m > 0 && n > 0 && k > 0 && batch > 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX &&
               batch <= INT_MAX,
           "gemm_batched: sizes m=", m, " n=", n, " k=", k, " batch=", batch,
           " must be in [1, INT_MAX]");
  if (blas.bound_stream != stream || stream == nullptr) {
    GW_CUBLAS_CHECK(cublasSetStream(blas.handle, stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(blas.handle, blas.workspace, blas.workspace_bytes));
  }
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  GW_CUBLAS_CHECK(cublasSgemmStridedBatched(
      blas.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, k * n, a, lda,
      m * k, &beta, c, static_cast<int>(n), m * n, static_cast<int>(batch)));
  mark_written(c, static_cast<std::size_t>(m * n * batch) * sizeof(float), stream);
}

void gemm_ex(const BlasContext& blas, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
             std::int64_t k, std::int64_t batch, float alpha, const void* a, const void* b,
             float beta, void* c, bool bf16, bool tf32, cudaStream_t stream, bool f32_out) {
  GW_CHECK(!(bf16 && tf32), "gemm_ex: TF32 applies to float32 storage, not bfloat16");
  GW_CHECK(bf16 || !f32_out, "gemm_ex: a float32 C from bfloat16 A and B needs bf16");
  GW_CHECK(m > 0 && n > 0 && k > 0 && batch > 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX &&
               batch <= INT_MAX,
           "gemm_ex: sizes m=", m, " n=", n, " k=", k, " batch=", batch,
           " must be in [1, INT_MAX]");
  if (blas.bound_stream != stream || stream == nullptr) {
    GW_CUBLAS_CHECK(cublasSetStream(blas.handle, stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(blas.handle, blas.workspace, blas.workspace_bytes));
  }
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t c_type = f32_out ? CUDA_R_32F : type;
  GW_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, type, ldb, k * n, a,
      type, lda, m * k, &beta, c, c_type, static_cast<int>(n), m * n, static_cast<int>(batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  mark_written(c, static_cast<std::size_t>(m * n * batch) * (c_type == CUDA_R_32F ? 4u : 2u),
               stream);
}

namespace {
// The algorithm's split of k (1: one kernel, no reduction).
std::int32_t splits(const cublasLtMatmulAlgo_t& algo) {
  std::int32_t split = 1;
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                           sizeof(split), &written) != CUBLAS_STATUS_SUCCESS) {
    return 1;
  }
  return split;
}
// Whether the algorithm adds its partial sums in a reduction kernel of its own (a split of k whose
// reduction is not in place): two kernels a launch.
bool reduces_apart(const cublasLtMatmulAlgo_t& algo) {
  if (splits(algo) <= 1) return false;
  std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS) {
    return true;
  }
  return scheme != CUBLASLT_REDUCTION_SCHEME_NONE && scheme != CUBLASLT_REDUCTION_SCHEME_INPLACE;
}
}  // namespace

namespace {
cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kNone:
      break;
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kRelu:
      return CUBLASLT_EPILOGUE_RELU;
    case Epilogue::kBiasRelu:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kBiasGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kReluAux:
      return CUBLASLT_EPILOGUE_RELU_AUX;
    case Epilogue::kBiasReluAux:
      return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epilogue::kDRelu:
      return CUBLASLT_EPILOGUE_DRELU;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
}  // namespace

LtGemm::LtGemm(cublasLtHandle_t handle, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, std::size_t workspace_bytes, unsigned alignment, LtOptions options)
    : handle_(handle), options_(options), workspace_bytes_(workspace_bytes) {
  GW_CHECK(m > 0 && n > 0 && k > 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
           "gemm: sizes m=", m, " n=", n, " k=", k, " must be in [1, INT_MAX]");
  GW_CHECK(options.epilogue == Epilogue::kNone || !options.bias_grad_a,
           "LtGemm: a forward epilogue and a bias gradient cannot be fused into one GEMM");
  GW_CHECK(options.batch <= 1 || (options.epilogue == Epilogue::kNone && !options.bias_grad_a),
           "LtGemm: a batched GEMM takes no epilogue");
  GW_CHECK(!(options.bf16 && options.tf32),
           "LtGemm: TF32 applies to float32 storage, not bfloat16");
  GW_CHECK(!options.f32_out || (options.bf16 && options.epilogue == Epilogue::kNone),
           "LtGemm: a float32 C is for bfloat16 A and B, with no epilogue but a bias gradient");
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's A is our B.
  const cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  try {
    // Storage: float32, or bfloat16 (A, B, C, the bias, its gradient and the aux); the arithmetic
    // and alpha/beta are float32 either way.
    const cudaDataType_t type = options.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        options.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    GW_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F));
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a,
                                                   sizeof(op_lt_a)));
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b,
                                                   sizeof(op_lt_b)));
    set_epilogue(type, n);
    // What a launch writes (Note [GEMM outputs and initcheck]): C; BGRADB's gradient, a value
    // per row of our C; a forward epilogue's aux matrix, ReLU's padded bit mask or GELU's input
    // laid out like C (a backward epilogue reads its aux).
    const std::size_t elt = options.bf16 ? 2u : 4u;
    const auto um = static_cast<std::size_t>(m), un = static_cast<std::size_t>(n);
    c_bytes_ = um * un * static_cast<std::size_t>(std::max<std::int64_t>(options.batch, 1)) *
               (options.f32_out ? 4u : elt);
    if (options.bias_grad_a) bias_grad_bytes_ = um * (options.f32_out ? 4u : elt);
    if (epilogue_has_aux(options.epilogue) && !epilogue_is_backward(options.epilogue)) {
      aux_bytes_ = epilogue_relu_mask(options.epilogue)
                       ? static_cast<std::size_t>(relu_mask_bytes(m, n))
                       : um * un * elt;
    }
    make_layouts(type, op_lt_a == CUBLAS_OP_N, op_lt_b == CUBLAS_OP_N,
                 static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m),
                 static_cast<std::uint64_t>(k));
    // cuBLASLt's GELU aux matrix needs a leading dimension that is a multiple of 8: not usable
    // otherwise (the caller runs separate kernels).
    if (epilogue_has_aux(options.epilogue) && !epilogue_relu_mask(options.epilogue) && n % 8 != 0) {
      return;
    }
    find_candidates(alignment, k);
  } catch (...) {
    release();
    throw;
  }
}

void LtGemm::set_epilogue(cudaDataType_t type, std::int64_t n) {
  if (options_.bias_grad_a) {
    // Our A is cuBLASLt's B: its bias gradient sums op(B) over k, one value per column of D.
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BGRADB;
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                   sizeof(epilogue)));
    const cudaDataType_t grad_type = options_.f32_out ? CUDA_R_32F : type;
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &grad_type, sizeof(grad_type)));
  }
  if (options_.epilogue == Epilogue::kNone) return;
  const cublasLtEpilogue_t epilogue = lt_epilogue(options_.epilogue);
  GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof(epilogue)));
  if (epilogue_has_bias(options_.epilogue)) {
    // cuBLASLt's bias has one value per row of its D (column-major [n, m]): per column of our
    // row-major C, as a linear layer's bias is.
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &type, sizeof(type)));
  }
  if (epilogue_has_aux(options_.epilogue)) {
    // ReLU's bit mask: a row of C per relu_mask_ld(n) bits; GELU's input: laid out like C.
    const bool mask = epilogue_relu_mask(options_.epilogue);
    const std::int64_t aux_ld = mask ? relu_mask_ld(n) : n;
    GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof(aux_ld)));
    if (!mask) {
      GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &type, sizeof(type)));
    }
  }
}

void LtGemm::make_layouts(cudaDataType_t type, bool na, bool nb, std::uint64_t mm, std::uint64_t nn,
                          std::uint64_t kk) {
  GW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, type, na ? mm : kk, na ? kk : mm,
                                             static_cast<std::int64_t>(na ? mm : kk)));
  GW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, type, nb ? kk : nn, nb ? nn : kk,
                                             static_cast<std::int64_t>(nb ? kk : nn)));
  const cudaDataType_t c_type = options_.f32_out ? CUDA_R_32F : type;
  GW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, c_type, mm, nn, static_cast<std::int64_t>(mm)));
  if (options_.batch <= 1) return;
  const std::int32_t count = static_cast<std::int32_t>(options_.batch);
  // Each operand's matrices back to back: the stride is one matrix (our A is m·k, B k·n).
  const std::int64_t strides[3] = {static_cast<std::int64_t>(mm * kk),  // cuBLASLt's A, B, C
                                   static_cast<std::int64_t>(kk * nn),
                                   static_cast<std::int64_t>(mm * nn)};
  cublasLtMatrixLayout_t layouts[3] = {a_, b_, c_};
  for (int i = 0; i < 3; ++i) {
    GW_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &count, sizeof(count)));
    GW_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(strides[i])));
  }
}

void LtGemm::find_candidates(unsigned alignment, std::int64_t k) {
  cublasLtMatmulPreference_t pref = nullptr;
  GW_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct DestroyPref {
    cublasLtMatmulPreference_t p;
    ~DestroyPref() { cublasLtMatmulPreferenceDestroy(p); }
  } destroy_pref{pref};
  const std::uint64_t ws = workspace_bytes_;
  GW_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::uint32_t align = alignment;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    GW_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  }
  // The heuristic's candidates, in its order (Note [Choosing a GEMM algorithm], engine/runtime/blas.cpp,
  // may time them). Without split_k each is taken with its split removed where cuBLASLt accepts
  // that, and dropped where it does not; the first left is the heuristic's choice.
  constexpr int kHeuristicResults = 8;
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults]{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, c_, c_, pref,
                                                           kHeuristicResults, results, &found);
  // NOT_SUPPORTED: no algorithm for this combination (an epilogue cuBLASLt lacks here).
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) GW_CUBLAS_CHECK(st);
  if (st != CUBLAS_STATUS_SUCCESS) return;
  auto add = [&](const cublasLtMatmulAlgo_t& algo) {
    if (n_candidates_ >= kMaxCandidates) return;
    for (int i = 0; i < n_candidates_; ++i) {
      if (std::memcmp(&candidates_[i], &algo, sizeof(algo)) == 0) return;
    }
    candidates_[n_candidates_++] = algo;
  };
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (options_.split_k) {
      add(results[i].algo);
    } else {
      const cublasLtMatmulAlgo_t one = unsplit(results[i].algo);
      if (splits(one) <= 1) add(one);
    }
  }
  // One-kernel splits of k (the partial sums added in C in turn, counters in the workspace): the
  // k-heavy small GEMMs — weight gradients over a batch of tokens — otherwise run in a few thread
  // blocks. The heuristic's own splits, and the first two candidates split 2–16 ways while each
  // part keeps at least 32 of k. Then the heuristic's splits as it made them, a reduction kernel
  // apart: for a few outputs over a long k (a classifier's 10 columns over 512 inputs) they take
  // half the time of any one-kernel candidate; tune() charges them the second launch.
  if (!options_.split_k) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && splits(results[i].algo) > 1) {
        if (auto one = split_in_place(results[i].algo, splits(results[i].algo))) add(*one);
      }
    }
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && reduces_apart(results[i].algo) &&
          results[i].workspaceSize <= workspace_bytes_) {
        add(results[i].algo);
      }
    }
    const int base = std::min(n_candidates_, 2);
    for (int i = 0; i < base; ++i) {
      for (std::int32_t split : {2, 4, 8, 16}) {
        if (k / split < 32 || n_candidates_ >= kMaxCandidates) continue;
        if (auto one = split_in_place(candidates_[i], split)) add(*one);
      }
    }
  }
  // Every candidate splits k and no split can be removed: the heuristic's choice as it is.
  if (n_candidates_ == 0 && found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) {
    candidates_[n_candidates_++] = results[0].algo;
  }
  if (n_candidates_ > 0) {
    algo_ = candidates_[0];
    usable_ = true;
  }
}

// `algo` with its split of k removed: the same algorithm, tile and stages as one kernel, where
// cuBLASLt accepts that configuration (else `algo` as it was). Dropping only the split keeps the
// heuristic's tile; asking it for a one-kernel algorithm instead can return a far slower tile
// (docs/DECISIONS.md, "split-K only above 2^24 multiply-adds").
cublasLtMatmulAlgo_t LtGemm::unsplit(const cublasLtMatmulAlgo_t& algo) const {
  if (splits(algo) <= 1) return algo;
  cublasLtMatmulAlgo_t one = algo;
  const std::int32_t no_split = 1;
  const std::uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &no_split,
                                           sizeof(no_split)) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                           &no_reduction,
                                           sizeof(no_reduction)) != CUBLAS_STATUS_SUCCESS) {
    return algo;
  }
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(handle_, desc_, a_, b_, c_, c_, &one, &check) ==
      CUBLAS_STATUS_SUCCESS) {
    return one;
  }
  return algo;
}

std::optional<cublasLtMatmulAlgo_t> LtGemm::split_in_place(const cublasLtMatmulAlgo_t& algo,
                                                           std::int32_t split) const {
  cublasLtMatmulAlgo_t one = algo;
  const std::uint32_t in_place = CUBLASLT_REDUCTION_SCHEME_INPLACE;
  if (cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                           sizeof(split)) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &in_place,
                                           sizeof(in_place)) != CUBLAS_STATUS_SUCCESS) {
    return std::nullopt;
  }
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(handle_, desc_, a_, b_, c_, c_, &one, &check) !=
          CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > workspace_bytes_) {
    return std::nullopt;
  }
  return one;
}

LtGemm::~LtGemm() {
  release();
}

void LtGemm::release() noexcept {
  if (c_) cublasLtMatrixLayoutDestroy(c_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  c_ = b_ = a_ = nullptr;
  desc_ = nullptr;
}

cublasStatus_t LtGemm::launch(const cublasLtMatmulAlgo_t& algo, float alpha, const void* a,
                              const void* b, float beta, void* c, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream, void* bias_grad,
                              const void* bias, void* aux) {
  if (options_.bias_grad_a) {
    GW_CHECK(bias_grad != nullptr,
             "LtGemm::run: this plan fuses a bias gradient; expected its "
             "output pointer, got null");
    if (bias_grad != bias_) {
      GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias_grad, sizeof(bias_grad)));
      bias_ = bias_grad;
    }
  }
  if (epilogue_has_bias(options_.epilogue)) {
    GW_CHECK(bias != nullptr, "LtGemm::run: this plan adds a bias; expected its pointer, got null");
    if (bias != bias_) {
      GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
      bias_ = bias;
    }
  }
  if (epilogue_has_aux(options_.epilogue)) {
    GW_CHECK(aux != nullptr, "LtGemm::run: this plan's epilogue has an aux matrix (the "
                             "pre-activation or ReLU's mask); expected its pointer, got null");
    if (aux != aux_) {
      GW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                     &aux, sizeof(aux)));
      aux_ = aux;
    }
  }
  // Note [GEMM outputs and initcheck]: an epilogue cuBLASLt runs as a kernel of its own reads the
  // product the main kernel wrote unseen; with beta = 0 nothing reads C before that, so C is
  // marked before the call instead of after.
  const bool c_first = beta == 0.f && options_.epilogue != Epilogue::kNone;
  if (c_first) mark_written(c, c_bytes_, stream);
  const cublasStatus_t status = cublasLtMatmul(handle_, desc_, &alpha, b, a_, a, b_, &beta, c, c_,
                                               c, c_, &algo, workspace, workspace_bytes, stream);
  if (status == CUBLAS_STATUS_SUCCESS) {  // each size 0 where the plan writes no such output
    if (!c_first) mark_written(c, c_bytes_, stream);
    mark_written(bias_grad, bias_grad_bytes_, stream);
    mark_written(aux, aux_bytes_, stream);
  }
  return status;
}

void LtGemm::run(float alpha, const void* a, const void* b, float beta, void* c, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream, void* bias_grad,
                 const void* bias, void* aux) {
  GW_CHECK(usable_, "LtGemm::run: no cuBLASLt algorithm for this shape; use gemm()");
  GW_CUBLAS_CHECK(launch(algo_, alpha, a, b, beta, c, workspace, workspace_bytes, stream, bias_grad,
                         bias, aux));
}

void LtGemm::use(int candidate) {
  GW_CHECK(candidate >= 0 && candidate < n_candidates_, "LtGemm::use: candidate ", candidate,
           " of ", n_candidates_);
  algo_ = candidates_[candidate];
}

namespace {

// Holds its stream until the host sets *flag (or `timeout_ns` pass), so that the launches queued
// behind it run back to back: their GPU time without the host's enqueue gaps.
__global__ void hold_until_set(const volatile unsigned* flag, unsigned long long timeout_ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*flag != 0u) return;
    __nanosleep(500);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < timeout_ns);
}

}  // namespace

LaunchTimer::LaunchTimer() {
  try {
    GW_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(unsigned), cudaHostAllocMapped));
    GW_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), flag_, 0));
    GW_CUDA_CHECK(cudaEventCreate(&start_));
    GW_CUDA_CHECK(cudaEventCreate(&end_));
  } catch (...) {
    release();
    throw;
  }
  set(0);
}

LaunchTimer::~LaunchTimer() {
  release();
}

void LaunchTimer::release() noexcept {
  if (end_) GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(end_));
  if (start_) GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(start_));
  if (flag_) GW_CUDA_CHECK_NOTHROW(cudaFreeHost(flag_));
  end_ = start_ = nullptr;
  flag_ = device_flag_ = nullptr;
}

void LaunchTimer::set(unsigned v) {
  std::atomic_thread_fence(std::memory_order_release);
  *static_cast<volatile unsigned*>(flag_) = v;
}

double LaunchTimer::time_us(cudaStream_t stream, const std::function<bool()>& launch) {
  constexpr int kTrials = 3, kRuns = 3;
  constexpr unsigned long long kHoldTimeoutNs = 2'000'000;  // 2 ms: a slow host times gaps too
  double best = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < kTrials; ++trial) {
    set(0);
    hold_until_set<<<1, 1, 0, stream>>>(device_flag_, kHoldTimeoutNs);
    GW_CUDA_CHECK(cudaGetLastError());
    GW_CUDA_CHECK(cudaEventRecord(start_, stream));
    bool ok = true;
    try {
      for (int r = 0; r < kRuns && ok; ++r) ok = launch();
    } catch (...) {
      set(1);
      throw;
    }
    GW_CUDA_CHECK(cudaEventRecord(end_, stream));
    set(1);
    GW_CUDA_CHECK(cudaEventSynchronize(end_));
    if (!ok) return std::numeric_limits<double>::infinity();
    float ms = 0;
    GW_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, end_));
    best = std::min(best, 1e3 * static_cast<double>(ms) / kRuns);
  }
  return best;
}

LtGemm::Timing LtGemm::tune(LaunchTimer& timer, float alpha, const void* a, const void* b,
                            float beta, void* c, void* workspace, std::size_t workspace_bytes,
                            cudaStream_t stream, void* bias_grad, const void* bias, void* aux) {
  GW_CHECK(usable_, "LtGemm::tune: no cuBLASLt algorithm for this shape");
  double best[kMaxCandidates];
  for (double& t : best) t = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n_candidates_; ++i) {
    best[i] = timer.time_us(stream, [&] {
      return launch(candidates_[i], alpha, a, b, beta, c, workspace, workspace_bytes, stream,
                    bias_grad, bias, aux) == CUBLAS_STATUS_SUCCESS;
    });
  }
  // The heuristic's choice stays unless another is faster by more than 3% (timing noise). Where
  // the split of k is off (small GEMMs, whose steps are bound by the host's launches), a
  // candidate with a reduction kernel apart is charged kReduceApartUs: what its second launch
  // costs the host of an eager step, where the choice runs too.
  double cost[kMaxCandidates];
  for (int i = 0; i < n_candidates_; ++i) {
    const bool charged = !options_.split_k && reduces_apart(candidates_[i]);
    cost[i] = best[i] + (charged ? kReduceApartUs : 0.0);
  }
  int chosen = 0;
  for (int i = 1; i < n_candidates_; ++i) {
    if (cost[i] < cost[chosen] && (chosen != 0 || cost[i] < 0.97 * cost[0])) chosen = i;
  }
  if (!std::isfinite(best[chosen])) chosen = 0;  // nothing launched: keep the heuristic's
  algo_ = candidates_[chosen];
  return {.chosen = chosen,
          .first_us = best[0],
          .chosen_us = best[chosen],
          .candidate_us = std::vector<double>(best, best + n_candidates_)};
}

std::string LtGemm::describe() const {
  if (!usable_) return "no cuBLASLt algorithm";
  return describe_algo(algo_);
}

std::string LtGemm::describe(int candidate) const {
  GW_CHECK(candidate >= 0 && candidate < n_candidates_, "LtGemm::describe: candidate ", candidate,
           " of ", n_candidates_);
  return describe_algo(candidates_[candidate]);
}

std::string LtGemm::describe_algo(const cublasLtMatmulAlgo_t& algo) const {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) -> long long {
    std::uint32_t v = 0;  // every attribute read here is a 32-bit integer
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
        CUBLAS_STATUS_SUCCESS) {
      return -1;
    }
    return static_cast<long long>(v);
  };
  std::string s = "algo " + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
                  std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
                  std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitK " +
                  std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " reduction " +
                  std::to_string(get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  if (options_.bias_grad_a) s += " +bias-grad epilogue";
  if (options_.epilogue != Epilogue::kNone) {
    s += " +epilogue " + std::to_string(static_cast<int>(options_.epilogue));
  }
  return s;
}

}  // namespace graphward::kernels
