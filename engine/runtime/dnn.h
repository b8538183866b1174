#pragma once
// Convolution and pooling through cuDNN (its legacy API: cudnnConvolutionForward & co.), for the
// conv2d and pooling ops (engine/ops/ops_conv.cpp).
//
// Note [cuDNN plans]
// One cuDNN handle per (thread, device), created on first use — outside any capture: creating it
// inside one throws, asking for an eager step first — and pointed at the op's stream before each
// call. Per shape, a plan made once and cached per (thread, device): the tensor, filter and
// convolution descriptors and the three algorithms (forward, backward data, backward filter):
// the fastest of cuDNN's candidates, timed once (cudnnFind*, which runs each on scratch memory
// and synchronizes) when the plan is made outside a capture, else — inside one, where nothing may
// run, or when the environment sets GRAPHWARD_CUDNN_FIND=0 (e.g. under compute-sanitizer, where
// timing every candidate takes minutes) — the heuristic's first (cudnnGet*Algorithm_v7,
// host-only); fp32 arithmetic without TF32 (CUDNN_FMA_MATH) unless conv_tf32() says otherwise
// (Note [TF32], engine/runtime/math_mode.h; a plan per setting), deterministic algorithms where one is offered (so that a replayed step
// equals the eager one bitwise), workspace at most kDnnWorkspaceLimit; in bfloat16, cuDNN's
// non-tensor-core algorithms only where nothing else qualifies (its one-run timing ranked them
// first at times, at many times the tensor-core ones' cost). A plan per dtype and layout (NCHW or
// channels last: the descriptors' CUDNN_TENSOR_NHWC, filters [K, R, S, C]). Every call takes
// its workspace from the caching allocator on the op's stream: inside a capture that is graph
// memory, fixed for the graph's lifetime, as a replay needs.
#include <cstddef>
#include <cstdint>
#include <string>
#include "graphward/base/config.h"

#include "graphward/base/dtype.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/kernels/conv.h"

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
struct cudnnContext;  // cudnnHandle_t's pointee (cudnn.h)
#endif

namespace graphward::dnn {

inline constexpr std::size_t kDnnWorkspaceLimit = std::size_t{256} << 20;

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
// Every tensor float32, or bfloat16 where the geometry says so (g.bf16: cuDNN's bfloat16
// descriptors, float32 accumulation, tensor-op math; a plan per dtype).
// y = x ⋆ w (+ bias [K] when not null).
void conv2d_forward(Device device, cudaStream_t stream, const kernels::ConvGeom& g, void* y,
                    const void* x, const void* w, const void* bias);
// dx, dw, db (=|+=) their gradients for dy.
void conv2d_backward_data(Device device, cudaStream_t stream, const kernels::ConvGeom& g, void* dx,
                          const void* dy, const void* w, bool accumulate);
void conv2d_backward_filter(Device device, cudaStream_t stream, const kernels::ConvGeom& g,
                            void* dw, const void* dy, const void* x, bool accumulate);
void conv2d_backward_bias(Device device, cudaStream_t stream, const kernels::ConvGeom& g, void* db,
                          const void* dy, bool accumulate);
// The plan's algorithms and workspace sizes, readable (tests, benchmarks), ending with
// "TF32 candidates N": how many of cuDNN's usable candidates, over the three directions, compute
// in TF32 (offered where TF32 is on; with it off, none of them is ever chosen).
std::string conv2d_plan_description(Device device, const kernels::ConvGeom& g);

void pool2d_forward(Device device, cudaStream_t stream, kernels::PoolMode mode,
                    const kernels::PoolGeom& g, void* y, const void* x);
// Max pooling reads x and y; average pooling reads neither (pass null).
void pool2d_backward(Device device, cudaStream_t stream, kernels::PoolMode mode,
                     const kernels::PoolGeom& g, void* dx, const void* dy, const void* x,
                     const void* y, bool accumulate);

// The thread's cuDNN handle for `device`, pointed at `stream` (Note [cuDNN plans]); `what` names
// the op in the error refusing a first call inside a capture.
cudnnContext* thread_handle(Device device, cudaStream_t stream, const char* what);
#endif

// Note [Fused attention]
// scaled_dot_product_attention (engine/ops/ops.h) of bfloat16 q, k, v on CUDA runs as cuDNN's fused
// attention (its SDPA through the cudnn-frontend graph API: flash-attention kernels, the scores
// never written to memory, fp32 softmax statistics [n, Tq] saved for the backward), where the
// build has the frontend (GRAPHWARD_HAS_CUDNN_FRONTEND, base/config.h) and cuDNN builds plans for
// the shape — forward and backward, the backward's deterministic algorithm (so that a replayed
// step equals the eager one bitwise). Dropout of the attention weights is cuDNN's own, fused into
// the kernels: its Philox draws from the seed and offset of the op's Generator
// (engine/runtime/generator.h), read on the device — a copy of them taken at the forward and saved, so
// that the backward drops what the forward dropped, then the generator's offset advanced by the
// weights' count (replays draw new masks). Its mask is cuDNN's draw, not the composed path's: the
// two agree in distribution, not element by element. A plan per shape is built once
// per (thread, device), outside any capture (its first use inside one is refused, asking for an
// eager step first), its workspace taken per call from the caching allocator on the op's stream
// (graph memory inside a capture); a shape cuDNN refuses is remembered with cuDNN's reason. Every
// other case takes the composed path (bmm, softmax or causal_softmax, dropout, bmm), and
// attention_path (engine/ops/ops.h) says which path a call takes and why.
struct SdpaGeom {
  std::int64_t n = 0;       // batches of heads (every leading dimension)
  std::int64_t tq = 0;      // query positions
  std::int64_t tk = 0;      // key positions
  std::int64_t d = 0;       // q's and k's head size
  std::int64_t dv = 0;      // v's head size
  bool causal = false;      // the mask aligned top left (PyTorch's is_causal)
  float scale = 1.f;        // of the scores
  float dropout = 0.f;      // probability of dropping an attention weight (0: none)
  // 0: q, k, v, o and their gradients are contiguous [n, t, d] tensors. heads > 0: packed, as
  // self_attention (engine/ops/ops.h) lays them out — q, k and v windows of one [b · tq, 3 · heads · d]
  // tensor (n = b · heads, tq = tk, d = dv; k at column heads · d, v at 2 · heads · d: their
  // pointers), their gradients likewise, o [b · tq, heads · d] (the heads merged); each row
  // holds its position's heads side by side.
  std::int64_t heads = 0;
  bool operator==(const SdpaGeom&) const = default;
};
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
// Whether cuDNN builds forward and backward plans for `g` on `device` (building and keeping them
// when it does; `stream` is where the handle points, nothing runs); else false, with cuDNN's
// reason in *why.
bool sdpa_supported(Device device, cudaStream_t stream, const SdpaGeom& g, std::string* why);
// o [n, tq, dv] = dropout(softmax(q·kᵀ · scale)) · v (causal: masked), stats [n, tq] the rows'
// log-sum-exp statistics; q [n, tq, d], k [n, tk, d], v [n, tk, dv], contiguous bfloat16 (or
// packed: SdpaGeom::heads). rng:
// where g.dropout > 0, int64[2] on the device, the Philox seed and offset (else null).
void sdpa_forward(Device device, cudaStream_t stream, const SdpaGeom& g, bf16* o, float* stats,
                  const bf16* q, const bf16* k, const bf16* v, const std::int64_t* rng);
// dq, dk, dv (overwritten) for do, from the forward's q, k, v, o, stats and rng.
void sdpa_backward(Device device, cudaStream_t stream, const SdpaGeom& g, bf16* dq, bf16* dk,
                   bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                   const bf16* d_o, const float* stats, const std::int64_t* rng);
#endif

}  // namespace graphward::dnn
