#include "graphward/engine/runtime/dnn.h"

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
#include <cudnn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "graphward/base/env.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/math_mode.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"

namespace graphward::dnn {
namespace {
using kernels::ConvGeom;
using kernels::PoolGeom;
using kernels::PoolMode;

// An owned cuDNN object: created by `create`, destroyed by `destroy` (a failure to destroy is
// logged, never thrown).
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Owned {
 public:
  Owned() { GW_CUDNN_CHECK(Create(&v_)); }
  ~Owned() {
    if (v_ && Destroy(v_) != CUDNN_STATUS_SUCCESS) {
      detail::log_error(__FILE__, __LINE__, "destroying a cuDNN descriptor failed");
    }
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T get() const { return v_; }

 private:
  T v_ = nullptr;
};
using TensorDesc =
    Owned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Owned<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                       cudnnDestroyConvolutionDescriptor>;
using PoolDesc =
    Owned<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

int as_int(std::int64_t v, const char* what) {
  GW_CHECK(v >= 0 && v <= INT32_MAX, "cuDNN: ", what, " is ", v, "; expected at most ", INT32_MAX);
  return static_cast<int>(v);
}
cudnnDataType_t data_type(bool bf16) {
  return bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}
// A 4-d tensor of logical sizes n, c, h, w, stored NCHW or (nhwc) channels last.
void set_4d(const TensorDesc& d, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
            bool bf16, bool nhwc) {
  GW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.get(), nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                            data_type(bf16), as_int(n, "N"), as_int(c, "C"),
                                            as_int(h, "H"), as_int(w, "W")));
}

// Picks the first (the fastest, or the heuristic's first) of the results that succeeded, fits the
// workspace limit, computes in fp32 (or, with `tf32`, may use tensor cores: Note [TF32]) and —
// when asked and where one does — is deterministic.
// A bfloat16 plan passes tf32: its algorithms are tensor-op ones.
// `avoid` (may be null): algorithms taken only where nothing else qualifies — a first pass leaves
// them out, a second takes every candidate.
template <class Perf>
Perf pick(const std::vector<Perf>& results, int found, bool deterministic, bool tf32,
          const char* what, bool (*avoid)(const Perf&) = nullptr) {
  const Perf* any = nullptr;
  for (int pass = avoid ? 0 : 1; pass < 2; ++pass) {
    for (int i = 0; i < found; ++i) {
      const Perf& p = results[static_cast<std::size_t>(i)];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kDnnWorkspaceLimit) continue;
      if (!tf32 && (p.mathType == CUDNN_TENSOR_OP_MATH ||
                    p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
        continue;  // fp32 stays fp32 (no TF32)
      }
      if (pass == 0 && avoid(p)) continue;
      if (!deterministic || p.determinism == CUDNN_DETERMINISTIC) return p;
      if (!any) any = &p;
    }
  }
  GW_CHECK(any, "conv2d: cuDNN offers no ", what, " algorithm for this shape within ",
           kDnnWorkspaceLimit >> 20, " MiB of workspace");
  return *any;
}

// The usable candidates (succeeded, within the workspace limit) that compute in TF32.
template <class Perf>
int count_tf32(const std::vector<Perf>& results, int found) {
  int n = 0;
  for (int i = 0; i < found; ++i) {
    const Perf& p = results[static_cast<std::size_t>(i)];
    n += p.status == CUDNN_STATUS_SUCCESS && p.memory <= kDnnWorkspaceLimit &&
         (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
  }
  return n;
}

struct ConvKey {
  std::int64_t n, c, h, w, k, r, s, pad, stride;
  bool deterministic;
  bool tf32;
  bool bf16;
  bool nhwc;
  bool operator==(const ConvKey&) const = default;
};
struct ConvKeyHash {
  std::size_t operator()(const ConvKey& g) const noexcept {
    std::size_t h = 0;
    for (std::int64_t v : {g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.pad, g.stride}) {
      h = h * 1000003u ^ std::hash<std::int64_t>()(v);
    }
    return h * 16 + g.nhwc * 8u + g.bf16 * 4u + g.deterministic * 2u + g.tf32;
  }
};

struct ConvPlan {
  TensorDesc x, y, bias;
  FilterDesc w;
  // One convolution descriptor per direction: each carries the math type of its algorithm (with
  // TF32 on, the three may differ).
  ConvDesc conv, conv_bwd_data, conv_bwd_filter;
  cudnnConvolutionFwdAlgoPerf_t fwd{};
  cudnnConvolutionBwdDataAlgoPerf_t bwd_data{};
  cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter{};
  bool timed = false;  // chosen by timing (cudnnFind*) rather than by the heuristic
  int tf32_candidates = 0;  // of cuDNN's usable candidates, those computing in TF32 (all directions)
};

struct PoolKey {
  PoolMode mode;
  std::int64_t n, c, h, w, window, pad, stride;
  bool bf16;
  bool nhwc;
  bool operator==(const PoolKey&) const = default;
};
struct PoolKeyHash {
  std::size_t operator()(const PoolKey& g) const noexcept {
    std::size_t h = static_cast<std::size_t>(g.mode);
    for (std::int64_t v : {g.n, g.c, g.h, g.w, g.window, g.pad, g.stride}) {
      h = h * 1000003u ^ std::hash<std::int64_t>()(v);
    }
    return h * 4 + g.nhwc * 2u + g.bf16;
  }
};
struct PoolPlan {
  TensorDesc x, y;
  PoolDesc pool;
};

class Handle {
 public:
  explicit Handle(Device device) : device_(device) {
    DeviceGuard guard(device);
    GW_CUDNN_CHECK(cudnnCreate(&h_));
  }
  ~Handle() {
    try {
      DeviceGuard guard(device_);
      if (cudnnDestroy(h_) != CUDNN_STATUS_SUCCESS) {
        detail::log_error(__FILE__, __LINE__, "cudnnDestroy failed while releasing a handle");
      }
    } catch (...) {
      detail::log_error(__FILE__, __LINE__, "cudnnDestroy failed while releasing a handle");
    }
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  Device device_;
  cudnnHandle_t h_ = nullptr;
};

struct DeviceDnn {
  std::unique_ptr<Handle> handle;
  cudaStream_t bound = nullptr;
  std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, ConvKeyHash> convs;
  std::unordered_map<PoolKey, std::unique_ptr<PoolPlan>, PoolKeyHash> pools;
};
// Per thread, one entry per device touched; destroyed at thread exit.
thread_local std::vector<std::unique_ptr<DeviceDnn>> t_dnn;

DeviceDnn& device_dnn(Device device) {
  check_cuda_device(device, "cuDNN");
  if (t_dnn.size() <= static_cast<std::size_t>(device.index)) t_dnn.resize(device.index + 1);
  auto& slot = t_dnn[device.index];
  if (!slot) slot = std::make_unique<DeviceDnn>();
  return *slot;
}

// The thread's handle for `device`, pointed at `stream`; `what` names the ops asking.
cudnnHandle_t handle_on(DeviceDnn& d, Device device, cudaStream_t stream,
                        const char* what = "conv2d/pooling") {
  if (!d.handle) {
    GW_CHECK(!capturing() && !stream_is_capturing(stream), what,
             ": the first cuDNN call of this thread on ", device.str(),
             " is inside a stream capture, where cuDNN cannot be initialized; expected one eager "
             "step on this thread before capturing");
    d.handle = std::make_unique<Handle>(device);
  }
  if (d.bound != stream) {
    GW_CUDNN_CHECK(cudnnSetStream(d.handle->get(), stream));
    d.bound = stream;
  }
  return d.handle->get();
}

// GRAPHWARD_CUDNN_FIND=0 ranks by the heuristic even outside a capture (Note [cuDNN plans]).
bool timing_allowed() {
  static const bool allowed = detail::env_switch("GRAPHWARD_CUDNN_FIND", true);
  return allowed;
}

ConvPlan& conv_plan(DeviceDnn& d, Device device, cudaStream_t stream, const ConvGeom& g) {
  // bfloat16 computes on tensor cores (float32 accumulation) whatever the TF32 switch says.
  const bool tf32 = conv_tf32() || g.bf16;
  const ConvKey key{g.n, g.c,  g.h,    g.w,   g.k, g.r, g.s, g.pad, g.stride, g.deterministic,
                    tf32, g.bf16, g.nhwc};
  auto it = d.convs.find(key);
  if (it != d.convs.end()) return *it->second;
  const cudnnHandle_t h = handle_on(d, device, stream);
  auto p = std::make_unique<ConvPlan>();
  set_4d(p->x, g.n, g.c, g.h, g.w, g.bf16, g.nhwc);
  set_4d(p->y, g.n, g.k, g.out_h(), g.out_w(), g.bf16, g.nhwc);
  set_4d(p->bias, 1, g.k, 1, 1, g.bf16, false);
  // Channels last: the filter [K, R, S, C] (cuDNN's NHWC filter format).
  GW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w.get(), data_type(g.bf16),
                                            g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                            as_int(g.k, "K"), as_int(g.c, "C"), as_int(g.r, "R"),
                                            as_int(g.s, "S")));
  const int pad = as_int(g.pad, "padding"), stride = as_int(g.stride, "stride");
  // fp32 FMA math (no TF32), or with TF32 on, tensor-op math: the candidates then include
  // the TF32 algorithms, and each direction's descriptor is set to its choice's math type below.
  for (const ConvDesc* c : {&p->conv, &p->conv_bwd_data, &p->conv_bwd_filter}) {
    GW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c->get(), pad, pad, stride, stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    GW_CUDNN_CHECK(
        cudnnSetConvolutionMathType(c->get(), tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
  // Outside a capture the algorithms are timed (cudnnFind*: each candidate run once on scratch
  // memory cuDNN allocates, then a synchronization — once per shape); inside one, where nothing
  // may run or allocate, the heuristic ranks them.
  p->timed = !capturing() && !stream_is_capturing(stream) && timing_allowed();
  int found = 0, count = 0;
  GW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(static_cast<std::size_t>(count));
  if (p->timed) {
    GW_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, p->x.get(), p->w.get(), p->conv.get(),
                                                        p->y.get(), count, &found, fwd.data()));
  } else {
    GW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x.get(), p->w.get(), p->conv.get(),
                                                          p->y.get(), count, &found, fwd.data()));
  }
  // bfloat16: the non-tensor-core algorithms (forward 0, backward-data 0, filter-gradient 0 and
  // 3: kernels such as convolve_common_engine_float_NHWC and wgrad_alg0_engine) are taken only
  // where no other qualifies. cuDNN's timing, one run of each candidate, ranked them first at
  // times (a forward of 20 µs where the tensor-core one takes a few, a filter gradient of 645 µs
  // of a 750 µs convnet step: docs/DECISIONS.md, "a channels-last convnet in bfloat16").
  bool (*slow_fwd)(const cudnnConvolutionFwdAlgoPerf_t&) =
      [](const cudnnConvolutionFwdAlgoPerf_t& p) {
        return p.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
      };
  p->fwd = pick(fwd, found, g.deterministic, tf32, "forward", g.bf16 ? slow_fwd : nullptr);
  p->tf32_candidates = count_tf32(fwd, found);
  GW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(static_cast<std::size_t>(count));
  if (p->timed) {
    GW_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
        h, p->w.get(), p->y.get(), p->conv_bwd_data.get(), p->x.get(), count, &found, bd.data()));
  } else {
    GW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p->w.get(), p->y.get(), p->conv_bwd_data.get(), p->x.get(), count, &found, bd.data()));
  }
  bool (*slow_data)(const cudnnConvolutionBwdDataAlgoPerf_t&) =
      [](const cudnnConvolutionBwdDataAlgoPerf_t& p) {
        return p.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
      };
  p->bwd_data =
      pick(bd, found, g.deterministic, tf32, "backward-data", g.bf16 ? slow_data : nullptr);
  p->tf32_candidates += count_tf32(bd, found);
  GW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(static_cast<std::size_t>(count));
  if (p->timed) {
    GW_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
        h, p->x.get(), p->y.get(), p->conv_bwd_filter.get(), p->w.get(), count, &found, bf.data()));
  } else {
    GW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p->x.get(), p->y.get(), p->conv_bwd_filter.get(), p->w.get(), count, &found, bf.data()));
  }
  bool (*slow_bf16)(const cudnnConvolutionBwdFilterAlgoPerf_t&) =
      [](const cudnnConvolutionBwdFilterAlgoPerf_t& p) {
        return p.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
               p.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
      };
  p->bwd_filter =
      pick(bf, found, g.deterministic, tf32, "backward-filter", g.bf16 ? slow_bf16 : nullptr);
  p->tf32_candidates += count_tf32(bf, found);
  if (tf32) {
    GW_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv.get(), p->fwd.mathType));
    GW_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv_bwd_data.get(), p->bwd_data.mathType));
    GW_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv_bwd_filter.get(), p->bwd_filter.mathType));
  }
  // The heuristic's figure is an estimate: ask for the exact workspace of each choice.
  GW_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p->x.get(), p->w.get(), p->conv.get(),
                                                         p->y.get(), p->fwd.algo, &p->fwd.memory));
  GW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      h, p->w.get(), p->y.get(), p->conv_bwd_data.get(), p->x.get(), p->bwd_data.algo,
      &p->bwd_data.memory));
  GW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h, p->x.get(), p->y.get(), p->conv_bwd_filter.get(), p->w.get(), p->bwd_filter.algo,
      &p->bwd_filter.memory));
  return *d.convs.emplace(key, std::move(p)).first->second;
}

// Scratch memory for one cuDNN call, from the caching allocator on the op's stream (graph memory
// inside a capture); empty for none.
Tensor workspace(Device device, std::size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<std::int64_t>((bytes + 3) / 4)}, {DType::kFloat32, device});
}
void* data_of(const Tensor& t) {
  return t.defined() ? t.raw_data() : nullptr;
}

const float kOne = 1.f, kZero = 0.f;
const float* beta_of(bool accumulate) {
  return accumulate ? &kOne : &kZero;
}

}  // namespace

cudnnContext* thread_handle(Device device, cudaStream_t stream, const char* what) {
  return handle_on(device_dnn(device), device, stream, what);
}

void conv2d_forward(Device device, cudaStream_t stream, const ConvGeom& g, void* y, const void* x,
                    const void* w, const void* bias) {
  DeviceDnn& d = device_dnn(device);
  ConvPlan& p = conv_plan(d, device, stream, g);
  const cudnnHandle_t h = handle_on(d, device, stream);
  const Tensor ws = workspace(device, p.fwd.memory);
  GW_CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, p.x.get(), x, p.w.get(), w, p.conv.get(),
                                         p.fwd.algo, data_of(ws), p.fwd.memory, &kZero, p.y.get(),
                                         y));
  if (!bias) return;
  if (g.bf16) {  // our bias pass: float32 sums, rounded once
    kernels::conv2d_bias_act(static_cast<bf16*>(y), static_cast<const bf16*>(bias), g, false,
                             stream);
  } else if (g.nhwc) {  // the same float addition as cudnnAddTensor's, the channel innermost
    kernels::conv2d_bias_act(static_cast<float*>(y), static_cast<const float*>(bias), g, false,
                             stream);
  } else {
    GW_CUDNN_CHECK(cudnnAddTensor(h, &kOne, p.bias.get(), bias, &kOne, p.y.get(), y));
  }
}

void conv2d_backward_data(Device device, cudaStream_t stream, const ConvGeom& g, void* dx,
                          const void* dy, const void* w, bool accumulate) {
  DeviceDnn& d = device_dnn(device);
  ConvPlan& p = conv_plan(d, device, stream, g);
  const cudnnHandle_t h = handle_on(d, device, stream);
  const Tensor ws = workspace(device, p.bwd_data.memory);
  GW_CUDNN_CHECK(cudnnConvolutionBackwardData(
      h, &kOne, p.w.get(), w, p.y.get(), dy, p.conv_bwd_data.get(), p.bwd_data.algo, data_of(ws),
      p.bwd_data.memory, beta_of(accumulate), p.x.get(), dx));
}

void conv2d_backward_filter(Device device, cudaStream_t stream, const ConvGeom& g, void* dw,
                            const void* dy, const void* x, bool accumulate) {
  DeviceDnn& d = device_dnn(device);
  ConvPlan& p = conv_plan(d, device, stream, g);
  const cudnnHandle_t h = handle_on(d, device, stream);
  const Tensor ws = workspace(device, p.bwd_filter.memory);
  GW_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      h, &kOne, p.x.get(), x, p.y.get(), dy, p.conv_bwd_filter.get(), p.bwd_filter.algo,
      data_of(ws), p.bwd_filter.memory, beta_of(accumulate), p.w.get(), dw));
}

void conv2d_backward_bias(Device device, cudaStream_t stream, const ConvGeom& g, void* db,
                          const void* dy, bool accumulate) {
  const std::int64_t ws = kernels::conv2d_bias_grad_workspace(g);
  const Tensor partial = ws > 0 ? Tensor::empty({ws}, {DType::kFloat32, device}) : Tensor();
  float* workspace = ws > 0 ? partial.data<float>() : nullptr;
  if (g.bf16) {
    kernels::conv2d_bias_grad(static_cast<bf16*>(db), static_cast<const bf16*>(dy), g, accumulate,
                              workspace, stream);
  } else {
    kernels::conv2d_bias_grad(static_cast<float*>(db), static_cast<const float*>(dy), g,
                              accumulate, workspace, stream);
  }
}

std::string conv2d_plan_description(Device device, const ConvGeom& g) {
  DeviceDnn& d = device_dnn(device);
  const ConvPlan& p = conv_plan(d, device, current_stream(device), g);
  std::ostringstream os;
  auto math = [](cudnnMathType_t m) {
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? ", TF32" : "";
  };
  os << (p.timed ? "timed: " : "heuristic: ") << "fwd algo " << p.fwd.algo << math(p.fwd.mathType)
     << " (" << p.fwd.memory << " B), bwd data algo " << p.bwd_data.algo
     << math(p.bwd_data.mathType) << " (" << p.bwd_data.memory << " B, "
     << (p.bwd_data.determinism == CUDNN_DETERMINISTIC ? "deterministic" : "non-deterministic")
     << "), bwd filter algo " << p.bwd_filter.algo << math(p.bwd_filter.mathType) << " ("
     << p.bwd_filter.memory << " B, "
     << (p.bwd_filter.determinism == CUDNN_DETERMINISTIC ? "deterministic" : "non-deterministic")
     << "); TF32 candidates " << p.tf32_candidates;
  return os.str();
}

namespace {
PoolPlan& pool_plan(DeviceDnn& d, PoolMode mode, const PoolGeom& g) {
  const PoolKey key{mode, g.n, g.c, g.h, g.w, g.window, g.pad, g.stride, g.bf16, g.nhwc};
  auto it = d.pools.find(key);
  if (it != d.pools.end()) return *it->second;
  auto p = std::make_unique<PoolPlan>();
  set_4d(p->x, g.n, g.c, g.h, g.w, g.bf16, g.nhwc);
  set_4d(p->y, g.n, g.c, g.out_h(), g.out_w(), g.bf16, g.nhwc);
  const int window = as_int(g.window, "window"), pad = as_int(g.pad, "padding"),
            stride = as_int(g.stride, "stride");
  GW_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
      p->pool.get(),
      mode == PoolMode::kMax ? CUDNN_POOLING_MAX_DETERMINISTIC
                             : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
      CUDNN_PROPAGATE_NAN, window, window, pad, pad, stride, stride));
  return *d.pools.emplace(key, std::move(p)).first->second;
}
}  // namespace

void pool2d_forward(Device device, cudaStream_t stream, PoolMode mode, const PoolGeom& g, void* y,
                    const void* x) {
  DeviceDnn& d = device_dnn(device);
  const cudnnHandle_t h = handle_on(d, device, stream);
  PoolPlan& p = pool_plan(d, mode, g);
  GW_CUDNN_CHECK(cudnnPoolingForward(h, p.pool.get(), &kOne, p.x.get(), x, &kZero, p.y.get(), y));
}

void pool2d_backward(Device device, cudaStream_t stream, PoolMode mode, const PoolGeom& g,
                     void* dx, const void* dy, const void* x, const void* y, bool accumulate) {
  DeviceDnn& d = device_dnn(device);
  const cudnnHandle_t h = handle_on(d, device, stream);
  PoolPlan& p = pool_plan(d, mode, g);
  // Average pooling reads neither x nor y; cuDNN's signature still takes them: dy stands for y
  // (same shape) and dx for x.
  GW_CUDNN_CHECK(cudnnPoolingBackward(h, p.pool.get(), &kOne, p.y.get(), y ? y : dy, p.y.get(), dy,
                                      p.x.get(), x ? x : dx, beta_of(accumulate), p.x.get(), dx));
}

}  // namespace graphward::dnn
#endif
