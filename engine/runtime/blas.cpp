#include "graphward/engine/runtime/blas.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graphward/base/env.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/gemm_choice.h"
#include "graphward/engine/runtime/math_mode.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/reduce.h"

namespace graphward {

namespace {
std::atomic<int> g_gemm_tuning{-1};  // -1: not yet read from the environment
}  // namespace

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
      // It synchronizes the device: Note [Device-wide waits and other threads' captures].
      detail::DeviceWideWait wait(device_.index);
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
    // No TF32 in cuBLAS's own float32 GEMMs; where it is on (Note [TF32]) they ask for it by
    // compute type (kernels::gemm_ex).
    GW_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
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
    // Zeros, once: a one-kernel split of k keeps its counters here (Note [Choosing a GEMM
    // algorithm]); nothing reads the workspace uninitialized.
    GW_CUDA_CHECK(cudaMemsetAsync(workspace.data(), 0, workspace.bytes(), stream));
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
           (static_cast<std::size_t>(g.options.bf16) << 11) ^
           (static_cast<std::size_t>(g.options.f32_out) << 9) ^
           (static_cast<std::size_t>(g.options.tf32) << 10);
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

// What a plan's first use hands to Note [Choosing a GEMM algorithm]'s timing: run()'s arguments
// that the candidates read (what they write goes to scratch memory, sized from the key).
struct FirstUse {
  float alpha = 1.f;
  const void* a = nullptr;
  const void* b = nullptr;
  float beta = 0.f;
  const void* bias = nullptr;  // a forward epilogue's bias
  void* aux = nullptr;         // a backward epilogue's aux (a forward one's is written: scratch)
};

// Note [Choosing a GEMM algorithm]
// cuBLASLt's heuristic picks an algorithm from the shape alone, and for the small GEMMs of a
// training step it often picks badly: a linear layer's 10-class classifier ran as one thread
// block of an unvectorized SIMT kernel, and a transformer's weight gradients with the
// bias-gradient epilogue took several times what other candidates of the same heuristic take
// (docs/DECISIONS.md, "a GEMM shape's algorithm is chosen by timing"). So a shape's first use
// outside a stream capture times the heuristic's candidates (up to 8, each one kernel where split-K
// is off, then one-kernel splits of k, and the heuristic's splits with their reduction kernel,
// charged the host time of that second launch) on the caller's stream, with the caller's inputs
// and scratch outputs, and keeps the fastest by GPU time (LtGemm::tune). Then it times what would
// run without the plan: for a plain GEMM cuBLAS's own (cublasSgemm picks kernels by other rules,
// and for the k-heavy weight gradients of small layers faster ones), for a fused bias gradient its
// GEMM and a column sum apart; where that is more than 10% faster the plan is declined and the
// callers' fallback runs instead. A GELU derivative's plan is declined the same way where its GEMM
// and graphward's GELU backward are more than 2% faster (both ways are two kernels). cuDNN's
// benchmark mode and torch.compile's max-autotune choose their kernels the same way. This costs the
// first step a synchronization and a few milliseconds per shape, once per process.
//
// The choice is made once per (shape, options, alignment) and device for the whole process, under
// a lock, and never changes: every thread's plan runs it, and an eager backward and the replay of
// its capture run the same kernels, so their results stay bitwise equal. A shape first used inside
// a capture (nothing can be timed there) keeps the heuristic's choice for good. Across processes
// the choice can differ where two candidates time within noise, and with it the rounding of the
// results: set_gemm_tuning(false) (or GRAPHWARD_GEMM_TUNING=0) runs the heuristic's choice
// everywhere, for bitwise reproducible runs. debug::gemm_choices lists what was chosen and the
// times measured.
struct ChoiceStore {
  std::mutex mutex;
  struct Made {
    cublasLtMatmulAlgo_t algo;
    bool declined;  // the plan is not run: what runs without it was timed faster
    debug::GemmChoice info;
  };
  // Per device: the choices, and where each key's is.
  std::vector<std::vector<Made>> made;
  std::vector<std::unordered_map<GemmKey, std::size_t, GemmKeyHash>> index;
};
ChoiceStore& choice_store() {
  static ChoiceStore store;
  return store;
}

std::string kind_of(const GemmKey& key) {
  if (key.options.bias_grad_a) return "gemm+bias_grad";
  if (key.options.epilogue != kernels::Epilogue::kNone) {
    return detail::concat("gemm+epilogue ", static_cast<int>(key.options.epilogue));
  }
  return "gemm";
}

// Scratch device memory on `stream` for the candidates' outputs, freed in stream order.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (cudaMallocAsync(&data_, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: the GEMM goes on with the heuristic's choice
      data_ = nullptr;
    }
  }
  ~Scratch() {
    if (data_) GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(data_, stream_));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

std::size_t round_up(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

kernels::LtGemm& lt_plan(DeviceBlas& blas, Device device, const GemmKey& key, StreamBlas& sb,
                         cudaStream_t stream, const FirstUse& use);

// cuBLAS's own GEMM for a plain key (no epilogue): what runs where cuBLASLt's plan is not usable.
void run_cublas(const GemmKey& key, StreamBlas& sb, cudaStream_t stream, float alpha, const void* a,
                const void* b, float beta, void* c) {
  const kernels::BlasContext ctx{sb.handle.get(), sb.workspace.data(), sb.workspace.bytes(),
                                 stream};
  if (key.options.bf16 || key.options.tf32) {
    kernels::gemm_ex(ctx, key.trans_a, key.trans_b, key.m, key.n, key.k, key.options.batch, alpha,
                     a, b, beta, c, key.options.bf16, key.options.tf32, stream,
                     key.options.f32_out);
  } else if (key.options.batch == 1) {
    kernels::gemm(ctx, key.trans_a, key.trans_b, key.m, key.n, key.k, alpha,
                  static_cast<const float*>(a), static_cast<const float*>(b), beta,
                  static_cast<float*>(c), stream);
  } else {
    kernels::gemm_batched(ctx, key.trans_a, key.trans_b, key.m, key.n, key.k, key.options.batch,
                          alpha, static_cast<const float*>(a), static_cast<const float*>(b), beta,
                          static_cast<float*>(c), stream);
  }
}

// A plain GEMM as run_gemm runs it: its plan, or cuBLAS's GEMM where the plan is not usable.
void run_plain(kernels::LtGemm& plan, const GemmKey& key, StreamBlas& sb, cudaStream_t stream,
               const FirstUse& use, void* c) {
  if (plan.usable()) {
    plan.run(use.alpha, use.a, use.b, use.beta, c, sb.workspace.data(), sb.workspace.bytes(),
             stream);
  } else {
    run_cublas(key, sb, stream, use.alpha, use.a, use.b, use.beta, c);
  }
}

// A bias-gradient plan just timed (`fused_us`): whether its GEMM without the epilogue and a column
// sum, timed now, are faster by more than 10% (then the caller runs them instead). Only for the
// linear layer's form (op(A) = Aᵀ, the sums run down A's columns). Writes both times into `info`.
bool apart_is_faster(DeviceBlas& blas, Device device, const GemmKey& key, StreamBlas& sb,
                     cudaStream_t stream, const FirstUse& use, kernels::LaunchTimer& timer,
                     char* c_scratch, char* g_scratch, double fused_us, debug::GemmChoice& info) {
  if (!key.trans_a || key.options.batch != 1) return false;
  GemmKey plain = key;
  plain.options.bias_grad_a = false;
  kernels::LtGemm& gemm_plan = lt_plan(blas, device, plain, sb, stream, use);
  const double gemm_us = timer.time_us(stream, [&] {
    run_plain(gemm_plan, plain, sb, stream, use, c_scratch);
    return true;
  });
  const double sum_us = timer.time_us(stream, [&] {
    if (key.options.f32_out) {
      kernels::column_sum(reinterpret_cast<float*>(g_scratch), static_cast<const bf16*>(use.a),
                          1.f, key.k, key.m, false, stream);
    } else if (key.options.bf16) {
      kernels::column_sum<bf16>(reinterpret_cast<bf16*>(g_scratch), static_cast<const bf16*>(use.a),
                                nullptr, 1.f, key.k, key.m, false, stream);
    } else {
      kernels::column_sum<float>(reinterpret_cast<float*>(g_scratch),
                                 static_cast<const float*>(use.a), nullptr, 1.f, key.k, key.m,
                                 false, stream);
    }
    return true;
  });
  info.alternative_us = gemm_us + sum_us;
  return gemm_us + sum_us < 0.9 * fused_us;
}

// A GELU-derivative plan just timed (`fused_us`): whether its GEMM without the epilogue and
// graphward's GELU backward over the product, in place, timed now, are faster by more than 2% (then
// the caller runs those two kernels, linear_backward's own). cuBLASLt runs this epilogue in a
// kernel after its GEMM (or in its split's reduction), so both ways launch two kernels; the margin
// only keeps timing noise (the best of three trials) from flipping the choice between processes.
// Writes the time apart into `info`.
bool act_grad_apart_is_faster(DeviceBlas& blas, Device device, const GemmKey& key, StreamBlas& sb,
                              cudaStream_t stream, const FirstUse& use, kernels::LaunchTimer& timer,
                              char* c_scratch, double fused_us, debug::GemmChoice& info) {
  if (key.options.batch != 1) return false;
  GemmKey plain = key;
  plain.options.epilogue = kernels::Epilogue::kNone;
  kernels::LtGemm& gemm_plan = lt_plan(blas, device, plain, sb, stream, use);
  const std::int64_t n = key.m * key.n;
  info.alternative_us = timer.time_us(stream, [&] {
    run_plain(gemm_plan, plain, sb, stream, use, c_scratch);
    if (key.options.bf16) {
      auto* c = reinterpret_cast<bf16*>(c_scratch);
      kernels::gelu_backward<bf16>(c, c, static_cast<const bf16*>(use.aux), n, false, stream);
    } else {
      auto* c = reinterpret_cast<float*>(c_scratch);
      kernels::gelu_backward<float>(c, c, static_cast<const float*>(use.aux), n, false, stream);
    }
    return true;
  });
  return info.alternative_us < 0.98 * fused_us;
}

// Makes the plan's choice: the process's, or one timed now, or the heuristic's.
void choose(DeviceBlas& blas, Device device, const GemmKey& key, kernels::LtGemm& plan,
            StreamBlas& sb, cudaStream_t stream, const FirstUse& use) {
  ChoiceStore& store = choice_store();
  const auto d = static_cast<std::size_t>(device.index);
  {
    std::lock_guard<std::mutex> lock(store.mutex);
    if (store.index.size() <= d) {
      store.index.resize(d + 1);
      store.made.resize(d + 1);
    }
    auto it = store.index[d].find(key);
    if (it != store.index[d].end()) {
      const ChoiceStore::Made& made = store.made[d][it->second];
      plan.use(made.algo);
      if (made.declined) plan.decline();
      return;
    }
  }
  debug::GemmChoice info;
  info.m = key.m;
  info.n = key.n;
  info.k = key.k;
  info.batch = key.options.batch;
  info.trans_a = key.trans_a;
  info.trans_b = key.trans_b;
  info.bf16 = key.options.bf16;
  info.tf32 = key.options.tf32;
  info.kind = kind_of(key);
  info.candidates = plan.candidates();
  bool declined = false;
  if (gemm_tuning() && !capturing() && !stream_is_capturing(stream)) {
    // Scratch for what the candidates write: C, the bias gradient, a forward epilogue's aux.
    const kernels::Epilogue ep = key.options.epilogue;
    const std::size_t element = key.options.bf16 ? 2 : sizeof(float);
    const std::size_t out_element = key.options.f32_out ? sizeof(float) : element;
    const auto mn = static_cast<std::size_t>(key.m * key.n);
    const std::size_t c_bytes = mn * static_cast<std::size_t>(key.options.batch) * out_element;
    const std::size_t grad_bytes =
        key.options.bias_grad_a ? static_cast<std::size_t>(key.m) * out_element : 0;
    const std::size_t aux_bytes =
        !kernels::epilogue_has_aux(ep) || kernels::epilogue_is_backward(ep) ? 0
        : kernels::epilogue_relu_mask(ep)
            ? static_cast<std::size_t>(kernels::relu_mask_bytes(key.m, key.n))
            : mn * element;
    const std::size_t g_off = round_up(c_bytes), x_off = g_off + round_up(grad_bytes);
    Scratch scratch(x_off + aux_bytes, stream);
    if (scratch.data()) {
      // Zeros: what beta reads, and what some of cuBLASLt's kernels load even where beta is 0.
      GW_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, x_off + aux_bytes, stream));
      kernels::LaunchTimer timer;
      const kernels::LtGemm::Timing t =
          plan.tune(timer, use.alpha, use.a, use.b, use.beta, scratch.data(), sb.workspace.data(),
                    sb.workspace.bytes(), stream, grad_bytes ? scratch.data() + g_off : nullptr,
                    use.bias, aux_bytes ? static_cast<void*>(scratch.data() + x_off) : use.aux);
      info.tuned = true;
      info.chosen = t.chosen;
      info.first_us = t.first_us;
      info.chosen_us = t.chosen_us;
      for (std::size_t i = 0; i < t.candidate_us.size(); ++i) {
        info.candidate_us.emplace_back(plan.describe(static_cast<int>(i)), t.candidate_us[i]);
      }
      if (key.options.bias_grad_a) {
        declined = apart_is_faster(blas, device, key, sb, stream, use, timer, scratch.data(),
                                   scratch.data() + g_off, t.chosen_us, info);
      } else if (key.options.epilogue == kernels::Epilogue::kDGelu) {
        declined = act_grad_apart_is_faster(blas, device, key, sb, stream, use, timer,
                                            scratch.data(), t.chosen_us, info);
      } else if (key.options.epilogue == kernels::Epilogue::kNone) {
        // cuBLAS's own GEMM picks its kernels by other rules (for the k-heavy weight gradients
        // of small layers, faster ones): declined where it is more than 10% faster.
        info.alternative_us = timer.time_us(stream, [&] {
          run_cublas(key, sb, stream, use.alpha, use.a, use.b, use.beta, scratch.data());
          return true;
        });
        declined = info.alternative_us < 0.9 * t.chosen_us;
      }
    }
  }
  info.algo = plan.describe();
  info.declined = declined;
  std::lock_guard<std::mutex> lock(store.mutex);
  auto [it, inserted] = store.index[d].try_emplace(key, store.made[d].size());
  if (inserted) {
    store.made[d].push_back({plan.algo(), declined, std::move(info)});
  } else {  // another thread chose first: its choice stands
    const ChoiceStore::Made& made = store.made[d][it->second];
    plan.use(made.algo);
    declined = made.declined;
  }
  if (declined) plan.decline();
}

// The cached cuBLASLt plan for a GEMM, made and chosen on first use.
kernels::LtGemm& lt_plan(DeviceBlas& blas, Device device, const GemmKey& key, StreamBlas& sb,
                         cudaStream_t stream, const FirstUse& use) {
  auto it = blas.lt_plans.find(key);
  if (it != blas.lt_plans.end()) return *it->second;
  if (!blas.lt) blas.lt = std::make_unique<LtHandle>(device);
  auto plan =
      std::make_unique<kernels::LtGemm>(blas.lt->get(), key.trans_a, key.trans_b, key.m, key.n,
                                        key.k, kBlasWorkspaceBytes, key.alignment, key.options);
  if (plan->usable()) choose(blas, device, key, *plan, sb, stream, use);
  return *blas.lt_plans.emplace(key, std::move(plan)).first->second;
}

}  // namespace

kernels::BlasContext blas_context(Device device, cudaStream_t stream) {
  StreamBlas& sb = stream_blas(device_blas(device), device, stream);
  return {sb.handle.get(), sb.workspace.data(), sb.workspace.bytes(), stream};
}

bool has_blas_context(Device device, cudaStream_t stream) noexcept {
  if (!device.is_cuda() || device.index < 0 ||
      t_blas.size() <= static_cast<std::size_t>(device.index))
    return false;
  const auto& slot = t_blas[static_cast<std::size_t>(device.index)];
  return slot && slot->streams.count(stream) != 0;
}

namespace {

// The GEMMs below for float32 (bf16 = false) or bfloat16 storage (float32 arithmetic).
void run_gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
              std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const void* a,
              const void* b, float beta, void* c, bool bf16, bool f32_out = false) {
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
                                       .bf16 = bf16,
                                       .f32_out = f32_out,
                                       .tf32 = !bf16 && matmul_tf32()}};
  kernels::LtGemm& plan =
      lt_plan(blas, device, key, sb, stream, {.alpha = alpha, .a = a, .b = b, .beta = beta});
  if (plan.usable()) {
    plan.run(alpha, a, b, beta, c, sb.workspace.data(), sb.workspace.bytes(), stream);
    return;
  }
  run_cublas(key, sb, stream, alpha, a, b, beta, c);
}

bool run_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, float alpha, const void* a, const void* b,
                   float beta, void* c, void* bias_grad, bool bf16, bool f32_out = false) {
  DeviceBlas& blas = device_blas(device);
  StreamBlas& sb = stream_blas(blas, device, stream);
  const GemmKey key{
      m,
      n,
      k,
      trans_a,
      trans_b,
      std::min({alignment_of(a), alignment_of(b), alignment_of(c), alignment_of(bias_grad)}),
      kernels::LtOptions{.bias_grad_a = true,
                         .split_k = gemm_allows_split_k(m, n, k),
                         .bf16 = bf16,
                         .f32_out = f32_out,
                         .tf32 = !bf16 && matmul_tf32()}};
  kernels::LtGemm& plan =
      lt_plan(blas, device, key, sb, stream, {.alpha = alpha, .a = a, .b = b, .beta = beta});
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
  // forward ones do: removing it was measured slower and saved no kernel (docs/DECISIONS.md,
  // "a linear+activation layer's gradient rides in the next layer's GEMM").
  const GemmKey key{m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                    alignment,
                    kernels::LtOptions{.bias_grad_a = false,
                                       .split_k = gemm_allows_split_k(m, n, k),
                                       .epilogue = epilogue,
                                       .bf16 = bf16,
                                       .tf32 = !bf16 && matmul_tf32()}};
  kernels::LtGemm& plan =
      lt_plan(blas, device, key, sb, stream, {.a = a, .b = b, .bias = bias, .aux = aux});
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
void gemm(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b, float beta,
          float* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, 1, alpha, a, b, beta, c, true, true);
}

void gemm_batched(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const float* a,
                  const float* b, float beta, float* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, batch, alpha, a, b, beta, c, false);
}
void gemm_batched(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, std::int64_t batch, float alpha, const bf16* a,
                  const bf16* b, float beta, bf16* c) {
  run_gemm(device, stream, trans_a, trans_b, m, n, k, batch, alpha, a, b, beta, c, true);
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
bool gemm_bias_grad(Device device, cudaStream_t stream, bool trans_a, bool trans_b, std::int64_t m,
                    std::int64_t n, std::int64_t k, float alpha, const bf16* a, const bf16* b,
                    float beta, float* c, float* bias_grad) {
  return run_bias_grad(device, stream, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, bias_grad,
                       true, true);
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

void set_gemm_tuning(bool on) {
  g_gemm_tuning.store(on ? 1 : 0, std::memory_order_relaxed);
}

bool gemm_tuning() {
  int v = g_gemm_tuning.load(std::memory_order_relaxed);
  if (v < 0) {
    const int from_env = detail::env_switch("GRAPHWARD_GEMM_TUNING", true) ? 1 : 0;
    g_gemm_tuning.compare_exchange_strong(v, from_env, std::memory_order_relaxed);
    v = g_gemm_tuning.load(std::memory_order_relaxed);
  }
  return v != 0;
}

namespace debug {
std::vector<GemmChoice> gemm_choices(Device device) {
  std::vector<GemmChoice> out;
#if GRAPHWARD_HAS_CUDA
  ChoiceStore& store = choice_store();
  std::lock_guard<std::mutex> lock(store.mutex);
  const auto d = static_cast<std::size_t>(device.index);
  if (device.is_cuda() && d < store.made.size()) {
    for (const auto& m : store.made[d]) out.push_back(m.info);
  }
#else
  (void)device;
#endif
  return out;
}
}  // namespace debug

}  // namespace graphward
