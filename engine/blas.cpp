#include "engine/blas.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/memory.h"

namespace graphward {

#if GRAPHWARD_HAS_CUDA
namespace {

// An owned cuBLAS or cuBLASLt handle of one device: created with the device current, configured,
// destroyed at the end with the device current again (a failure to destroy is logged, never
// thrown).
template <class Traits>
class OwnedHandle {
 public:
  using Handle = typename Traits::Handle;
  explicit OwnedHandle(Device device) : device_(device) {
    DeviceGuard guard(device);
    GW_CUBLAS_CHECK(Traits::create(&handle_));
    try {
      Traits::configure(handle_);
    } catch (...) {
      Traits::destroy(handle_);
      throw;
    }
  }
  ~OwnedHandle() {
    if (!handle_) return;
    try {
      DeviceGuard guard(device_);
      if (Traits::destroy(handle_) != CUBLAS_STATUS_SUCCESS) {
        detail::log_error(__FILE__, __LINE__, Traits::kDestroyFailed);
      }
    } catch (...) {
      detail::log_error(__FILE__, __LINE__, Traits::kDestroyFailed);
    }
  }
  OwnedHandle(const OwnedHandle&) = delete;
  OwnedHandle& operator=(const OwnedHandle&) = delete;
  Handle get() const { return handle_; }

 private:
  Device device_;
  Handle handle_ = nullptr;
};

struct CublasTraits {
  using Handle = cublasHandle_t;
  static constexpr const char* kDestroyFailed = "cublasDestroy failed while releasing a handle";
  static cublasStatus_t create(Handle* h) { return cublasCreate(h); }
  static cublasStatus_t destroy(Handle h) { return cublasDestroy(h); }
  static void configure(Handle h) {
    GW_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // no TF32
  }
};
struct CublasLtTraits {
  using Handle = cublasLtHandle_t;
  static constexpr const char* kDestroyFailed = "cublasLtDestroy failed while releasing a handle";
  static cublasStatus_t create(Handle* h) { return cublasLtCreate(h); }
  static cublasStatus_t destroy(Handle h) { return cublasLtDestroy(h); }
  static void configure(Handle) {}
};
using BlasHandle = OwnedHandle<CublasTraits>;
using LtHandle = OwnedHandle<CublasLtTraits>;

// One handle per stream, bound once to that stream and its own workspace.
struct StreamBlas {
  StreamBlas(Device device, cudaStream_t stream)
      : handle(device), workspace(device, kBlasWorkspaceBytes) {
    GW_CUBLAS_CHECK(cublasSetStream(handle.get(), stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(handle.get(), workspace.data(), workspace.bytes()));
  }
  BlasHandle handle;
  DeviceBuffer workspace;
};

struct GemmKey {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  unsigned alignment;
  kernels::LtOptions options;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  std::size_t operator()(const GemmKey& g) const noexcept {
    std::size_t h = std::hash<std::int64_t>()(g.m);
    h = h * 1000003u ^ std::hash<std::int64_t>()(g.n);
    h = h * 1000003u ^ std::hash<std::int64_t>()(g.k);
    return h * 31u ^ (g.trans_a * 2u + g.trans_b) ^ (std::size_t{g.alignment} << 8) ^
           (std::size_t{g.options.bias_grad_a} << 2) ^ (std::size_t{g.options.split_k} << 3) ^
           (static_cast<std::size_t>(g.options.epilogue) << 4) ^
           (static_cast<std::size_t>(g.options.batch) << 12) ^
           (static_cast<std::size_t>(g.options.bf16) << 11);
  }
};

struct DeviceBlas {
  std::unique_ptr<LtHandle> lt;
  std::unordered_map<GemmKey, std::unique_ptr<kernels::LtGemm>, GemmKeyHash> lt_plans;
  std::unordered_map<cudaStream_t, std::unique_ptr<StreamBlas>> streams;
  cudaStream_t last_stream = nullptr;  // one-entry cache in front of the map
  StreamBlas* last = nullptr;
};

// Per thread: one entry per device touched. Destroyed at thread exit (before the runtime unloads
// for the main thread, since thread_local destructors run before atexit handlers).
thread_local std::vector<std::unique_ptr<DeviceBlas>> t_blas;

DeviceBlas& device_blas(Device device) {
  check_cuda_device(device, "blas_context");
  if (t_blas.size() <= static_cast<std::size_t>(device.index)) t_blas.resize(device.index + 1);
  auto& slot = t_blas[device.index];
  if (!slot) slot = std::make_unique<DeviceBlas>();
  return *slot;
}

}  // namespace

namespace {

StreamBlas& stream_blas(DeviceBlas& blas, Device device, cudaStream_t stream) {
  if (blas.last_stream != stream || !blas.last) {
    auto it = blas.streams.find(stream);
    if (it == blas.streams.end()) {
      it = blas.streams.emplace(stream, std::make_unique<StreamBlas>(device, stream)).first;
    }
    blas.last_stream = stream;
    blas.last = it->second.get();
  }
  return *blas.last;
}

unsigned alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  unsigned a = 256;
  while (a > 4 && (v % a) != 0) a /= 2;
  return a;
}

// The cached cuBLASLt plan for a GEMM, made on first use.
kernels::LtGemm& lt_plan(DeviceBlas& blas, Device device, const GemmKey& key) {
  auto it = blas.lt_plans.find(key);
  if (it == blas.lt_plans.end()) {
    if (!blas.lt) blas.lt = std::make_unique<LtHandle>(device);
    it = blas.lt_plans
             .emplace(key, std::make_unique<kernels::LtGemm>(
                               blas.lt->get(), key.trans_a, key.trans_b, key.m, key.n, key.k,
                               kBlasWorkspaceBytes, key.alignment, key.options))
             .first;
  }
  return *it->second;
}

}  // namespace

kernels::BlasContext blas_context(Device device, cudaStream_t stream) {
  StreamBlas& sb = stream_blas(device_blas(device), device, stream);
  return {sb.handle.get(), sb.workspace.data(), sb.workspace.bytes(), stream};
}

namespace {

// The GEMMs below for float32 (bf16 = false) or bfloat16 storage (float32 arithmetic).
void run_gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
              std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const void* a,
              const void* b, float beta, void* c, bool bf16) {
  DeviceBlas& blas = device_blas(device);
  StreamBlas& sb = stream_blas(blas, device, stream);  // the stream's workspace
  unsigned alignment = std::min({alignment_of(a), alignment_of(b), alignment_of(c)});
  if (batch > 1) {  // every matrix of the batch starts one matrix after the previous one
    const std::size_t element = bf16 ? 2 : sizeof(float);
    for (std::int64_t elements : {m * k, k * n, m * n}) {
      alignment = std::min(alignment, alignment_of(reinterpret_cast<const void*>(
                                          static_cast<std::uintptr_t>(elements * element))));
    }
  }
  const GemmKey key{m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                    alignment,
                    kernels::LtOptions{.bias_grad_a = false,
                                       .split_k = gemm_allows_split_k(m, n, k * batch),
                                       .batch = batch,
                                       .bf16 = bf16}};
  kernels::LtGemm& plan = lt_plan(blas, device, key);
  if (plan.usable()) {
    plan.run(alpha, a, b, beta, c, sb.workspace.data(), sb.workspace.bytes(), stream);
    return;
  }
  const kernels::BlasContext ctx{sb.handle.get(), sb.workspace.data(), sb.workspace.bytes(), stream};
  if (bf16) {
    kernels::gemm_bf16(ctx, trans_a, trans_b, m, n, k, batch, alpha, a, b, beta, c, stream);
  } else if (batch == 1) {
    kernels::gemm(ctx, trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a),
                  static_cast<const float*>(b), beta, static_cast<float*>(c), stream);
  } else {
    kernels::gemm_batched(ctx, trans_a, trans_b, m, n, k, batch, alpha,
                          static_cast<const float*>(a), static_cast<const float*>(b), beta,
                          static_cast<float*>(c), stream);
  }
}

bool run_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, float alpha, const void* a, const void* b,
                   float beta, void* c, void* bias_grad, bool bf16) {
  DeviceBlas& blas = device_blas(device);
  StreamBlas& sb = stream_blas(blas, device, stream);
  const GemmKey key{
      m,
      n,
      k,
      trans_a,
      trans_b,
      std::min({alignment_of(a), alignment_of(b), alignment_of(c), alignment_of(bias_grad)}),
      kernels::LtOptions{
          .bias_grad_a = true, .split_k = gemm_allows_split_k(m, n, k), .bf16 = bf16}};
  kernels::LtGemm& plan = lt_plan(blas, device, key);
  if (!plan.usable()) return false;
  plan.run(alpha, a, b, beta, c, sb.workspace.data(), sb.workspace.bytes(), stream, bias_grad);
  return true;
}

// A forward epilogue (bias read, aux written), or a backward one (aux read).
bool run_epilogue(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, const void* a, const void* b, void* c,
                  kernels::Epilogue epilogue, const void* bias, void* aux, bool bf16) {
  DeviceBlas& blas = device_blas(device);
  StreamBlas& sb = stream_blas(blas, device, stream);
  unsigned alignment = std::min({alignment_of(a), alignment_of(b), alignment_of(c)});
  if (kernels::epilogue_has_bias(epilogue)) alignment = std::min(alignment, alignment_of(bias));
  if (kernels::epilogue_has_aux(epilogue)) alignment = std::min(alignment, alignment_of(aux));
  // Backward epilogues (Note [Backward epilogue fusion]) keep the heuristic's split as the
  // forward ones do: removing it was measured slower on the H200 (the MLP of hidden 2048: 2508
  // against 2020 us per eager step) and saved no kernel (docs/RESULTS.md).
  const GemmKey key{m, n, k, trans_a, trans_b, alignment,
                    kernels::LtOptions{.bias_grad_a = false,
                                       .split_k = gemm_allows_split_k(m, n, k),
                                       .epilogue = epilogue,
                                       .bf16 = bf16}};
  kernels::LtGemm& plan = lt_plan(blas, device, key);
  if (!plan.usable()) return false;
  plan.run(1.f, a, b, 0.f, c, sb.workspace.data(), sb.workspace.bytes(), stream, nullptr, bias,
           aux);
  return true;
}

}  // namespace

void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b, float beta,
          float* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, 1, alpha, a, b, beta, c, false);
}
void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b, float beta,
          bf16* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, 1, alpha, a, b, beta, c, true);
}

void gemm_batched(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const float* a,
                  const float* b, float beta, float* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, batch, alpha, a, b, beta, c, false);
}

bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const float* a, const float* b,
                    float beta, float* c, float* bias_grad) {
  return run_bias_grad(device, stream, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, bias_grad,
                       false);
}
bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b,
                    float beta, bf16* c, bf16* bias_grad) {
  return run_bias_grad(device, stream, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, bias_grad,
                       true);
}

bool gemm_epilogue(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const float* a, const float* b, float* c,
                   kernels::Epilogue epilogue, const float* bias, void* aux) {
  return run_epilogue(device, stream, trans_a, trans_b, m, n, k, a, b, c, epilogue, bias, aux,
                      false);
}
bool gemm_epilogue(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const bf16* a, const bf16* b, bf16* c,
                   kernels::Epilogue epilogue, const bf16* bias, void* aux) {
  return run_epilogue(device, stream, trans_a, trans_b, m, n, k, a, b, c, epilogue, bias, aux,
                      true);
}

bool gemm_act_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const float* a, const float* b, float* c,
                   kernels::Epilogue epilogue, const void* aux) {
  GW_CHECK(kernels::epilogue_is_backward(epilogue), "gemm_act_grad: expected a backward epilogue");
  return run_epilogue(device, stream, trans_a, trans_b, m, n, k, a, b, c, epilogue, nullptr,
                      const_cast<void*>(aux), false);
}
bool gemm_act_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const bf16* a, const bf16* b, bf16* c,
                   kernels::Epilogue epilogue, const void* aux) {
  GW_CHECK(kernels::epilogue_is_backward(epilogue), "gemm_act_grad: expected a backward epilogue");
  return run_epilogue(device, stream, trans_a, trans_b, m, n, k, a, b, c, epilogue, nullptr,
                      const_cast<void*>(aux), true);
}

#endif

}  // namespace graphward
