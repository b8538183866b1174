#pragma once
// Convolution and pooling geometry, and the CPU references. The CUDA versions are cuDNN's
// (engine/runtime/dnn.h) but for the kernels of ours declared below. Layout NCHW, row-major, weights [K,
// C, R, S] (PyTorch's) — or, channels last (`nhwc`), NHWC with weights [K, R, S, C] (cuDNN's
// NHWC filter layout, where its sm80+ tensor-core kernels read without transposing). Square
// kernels, strides and padding (the same in both spatial dimensions), dilation 1, one group.
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

struct ConvGeom {
  std::int64_t n, c, h, w;  // input
  std::int64_t k, r, s;     // K filters of C x R x S
  std::int64_t pad, stride;
  // CUDA: only deterministic cuDNN algorithms (Conv2dOptions::deterministic); the CPU always is.
  bool deterministic = true;
  // CUDA: bfloat16 tensors (x, w, y and their gradients; float32 accumulation, tensor cores).
  bool bf16 = false;
  // Channels last: x [N, H, W, C], w [K, R, S, C], y [N, OH, OW, K] (else NCHW, [K, C, R, S]).
  bool nhwc = false;
  std::int64_t out_h() const { return (h + 2 * pad - r) / stride + 1; }
  std::int64_t out_w() const { return (w + 2 * pad - s) / stride + 1; }
};

enum class PoolMode : std::uint8_t { kMax, kAverage };
// Average pooling divides by the window's full size, padding included (PyTorch's default
// count_include_pad=True); max pooling ignores the padding.
struct PoolGeom {
  std::int64_t n, c, h, w;
  std::int64_t window, pad, stride;
  bool bf16 = false;  // CUDA: bfloat16 tensors
  bool nhwc = false;  // channels last: x [N, H, W, C], y [N, OH, OW, C] (else NCHW)
  std::int64_t out_h() const { return (h + 2 * pad - window) / stride + 1; }
  std::int64_t out_w() const { return (w + 2 * pad - window) / stride + 1; }
};

#if GRAPHWARD_HAS_CUDA
// S: float or bf16 (bfloat16 storage, float32 arithmetic, each output rounded once).
// db [K] (=|+=) Σ over images and positions of dy [N, K, OH, OW]: deterministic; `workspace` holds
// conv2d_bias_grad_workspace(g) floats (none needed when that is 0). Channels last (dy
// [N, OH, OW, K]): slices of rows, a block each, then their partial sums in order. (Our own reduction:
// docs/DECISIONS.md, "a convolution's bias gradient by a reduction of our own".)
std::int64_t conv2d_bias_grad_workspace(const ConvGeom& g);
// The weight gradient of a convolution with few taps a filter and little work — C·R·S ≤ 32 (a
// first convolution on images: 3·3·3 = 27) and N·OH·OW·K·C·R·S ≤ 2^25 (bfloat16: any work) — and
// its bias gradient
// with it: dw [K, C, R, S] (=|+=) Σ over images and output positions of dy · x at each tap
// (padding skipped); db [K] (=|+=) Σ dy (db may be null: dw alone). Deterministic (fixed-order
// sums, no atomics); `workspace` holds conv2d_weight_grad_small_workspace(g) floats (none needed
// when that is 0). Our own where cuDNN's fastest algorithm leaves the GPU nearly idle (docs/
// DECISIONS.md, "a first convolution's weight gradient by a kernel of our own"). S: float or bf16
// (float32 sums, each gradient rounded once).
bool conv2d_weight_grad_small_fits(const ConvGeom& g);
std::int64_t conv2d_weight_grad_small_workspace(const ConvGeom& g);
template <class S>
void conv2d_weight_grad_small(S* dw, bool accumulate_w, S* db, bool accumulate_b, const S* dy,
                              const S* x, const ConvGeom& g, float* workspace,
                              cudaStream_t stream);
// Channels last: each output position's input patch, in the filter's [R, S, C] order, as a row
// of cols [N·OH·OW, ld] (ld ≥ C·R·S; the columns from C·R·S on, and the taps in the padding, are
// zeros — but with `ones`, column C·R·S holds 1s, ld > C·R·S): the operand of a few-tap
// convolution's weight gradient as one GEMM, dW = dYᵀ·cols (engine/ops/ops_conv.cpp), whose column C·R·S
// is then the bias gradient (Σ over positions of dY).
template <class S>
void conv2d_patches_nhwc(S* cols, const S* x, const ConvGeom& g, std::int64_t ld,
                         cudaStream_t stream, bool ones = false);
// That GEMM's g [K, ld] split: dw [K, C·R·S] (=|+=) its first C·R·S columns, db [K] (=|+=) column
// C·R·S (skipped where db is null); one launch.
template <class S>
void conv2d_split_patch_grads(S* dw, bool accumulate_w, S* db, bool accumulate_b, const S* g,
                              const ConvGeom& geom, std::int64_t ld, cudaStream_t stream);
// dst [K, ld] = the filters w [K, C·R·S] (either layout's order) as rows padded with zeros to ld:
// the other operand of a few-tap convolution's forward as one GEMM, y = patches·dstᵀ.
template <class S>
void conv2d_pad_filters(S* dst, const S* w, const ConvGeom& g, std::int64_t ld,
                        cudaStream_t stream);
// y [N, K, OH, OW] (or [N, OH, OW, K], g.nhwc) = act(y + bias [K]) in place, one pass: bias may be null; `relu` applies ReLU
// (max(v, 0) as relu_forward does). The same float additions as cudnnAddTensor's with
// alpha = beta = 1, so bitwise the bias add then the ReLU apart.
template <class S>
void conv2d_bias_act(S* y, const S* bias, const ConvGeom& g, bool relu, cudaStream_t stream);
template <class S>
void conv2d_bias_grad(S* db, const S* dy, const ConvGeom& g, bool accumulate, float* workspace,
                      cudaStream_t stream);
// Pooling's backward through the ReLU that made its input x [N, C, H, W] (or NHWC: g.nhwc, the
// same sums, a thread per element along the channels) (Note [Backward
// epilogue fusion], engine/ops/ops.h): where x is positive, dx (=|+=) the sum over the windows that
// hold the element, in row-major order, of dy [N, C, OH, OW] — max: the windows whose first
// maximum (row-major) it is; average: dy / window area each — and 0 elsewhere. y: the pooling's
// output (max only; may be null for average). One thread per input element: no atomics,
// deterministic. Bitwise cuDNN's pooling backward then relu_backward where windows do not
// overlap, a window's positive maximum is unique (cuDNN may pick another of equal positive
// maxima; a zero maximum sends nothing through the ReLU either way) and, for average pooling,
// the window's area is a power of two (cuDNN's scaling is then exact too).
// Channels last, 2x2 windows of stride 2 without padding tiling the image (H and W even): y =
// each window's maximum (NaN where the window holds one, as cuDNN's CUDNN_PROPAGATE_NAN) or mean
// (the float32 sum in row-major order, / 4), a thread per output element — where cuDNN's
// channels-last pooling runs a generic kernel (52 µs for what this reads in 15: docs/
// DECISIONS.md, "a channels-last convnet in bfloat16").
bool pool2d_tiled_nhwc_fits(const PoolGeom& g);
template <class S>
void pool2d_forward_tiled_nhwc(PoolMode mode, S* y, const S* x, const PoolGeom& g,
                               cudaStream_t stream);
template <class S>
void pool2d_backward_relu(PoolMode mode, S* dx, const S* dy, const S* x, const S* y,
                          const PoolGeom& g, bool accumulate, cudaStream_t stream);
#endif

namespace cpu {
// y [N, K, OH, OW] = x ⋆ w (+ bias [K], may be null). Accumulates in double. Either layout
// (g.nhwc), each element's sum over the same terms in the same order.
template <class T>
void conv2d_forward(T* y, const T* x, const T* w, const T* bias, const ConvGeom& g);
// dx (=|+=) the gradient of x for dy; dw (=|+=) the gradient of w; db (=|+=) Σ dy per channel.
template <class T>
void conv2d_backward_data(T* dx, const T* dy, const T* w, const ConvGeom& g, bool accumulate);
template <class T>
void conv2d_backward_filter(T* dw, const T* dy, const T* x, const ConvGeom& g, bool accumulate);
template <class T>
void conv2d_backward_bias(T* db, const T* dy, const ConvGeom& g, bool accumulate);

template <class T>
void pool2d_forward(PoolMode mode, T* y, const T* x, const PoolGeom& g);
// Max: each window's gradient goes to its first maximum (x and y read); average: spread evenly.
// relu_input (may be null): the gradient also passes the ReLU that made the pooling's input —
// zero where relu_input is not positive, as relu_backward would make it (Note [Backward epilogue
// fusion], engine/ops/ops.h); with max pooling relu_input is x itself.
template <class T>
void pool2d_backward(PoolMode mode, T* dx, const T* dy, const T* x, const T* y, const PoolGeom& g,
                     bool accumulate, const T* relu_input = nullptr);
}  // namespace cpu

}  // namespace graphward::kernels
