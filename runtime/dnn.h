#pragma once
// Convolution and pooling through cuDNN (its legacy API: cudnnConvolutionForward & co.), for the
// conv2d and pooling ops (ops/ops_conv.cpp).
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
// (Note [TF32], runtime/math_mode.h; a plan per setting), deterministic algorithms where one is offered (so that a replayed step
// equals the eager one bitwise), workspace at most kDnnWorkspaceLimit. Every call takes
// its workspace from the caching allocator on the op's stream: inside a capture that is graph
// memory, fixed for the graph's lifetime, as a replay needs.
#include <cstddef>
#include <string>
#include "base/config.h"

#include "kernels/conv.h"
#include "runtime/cuda.h"
#include "runtime/device.h"

namespace graphward::dnn {

inline constexpr std::size_t kDnnWorkspaceLimit = std::size_t{256} << 20;

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
// y = x ⋆ w (+ bias [K] when not null).
void conv2d_forward(Device device, cudaStream_t stream, const kernels::ConvGeom& g, float* y,
                    const float* x, const float* w, const float* bias);
// dx, dw, db (=|+=) their gradients for dy.
void conv2d_backward_data(Device device, cudaStream_t stream, const kernels::ConvGeom& g, float* dx,
                          const float* dy, const float* w, bool accumulate);
void conv2d_backward_filter(Device device, cudaStream_t stream, const kernels::ConvGeom& g,
                            float* dw, const float* dy, const float* x, bool accumulate);
void conv2d_backward_bias(Device device, cudaStream_t stream, const kernels::ConvGeom& g, float* db,
                          const float* dy, bool accumulate);
// The plan's algorithms and workspace sizes, readable (tests, benchmarks).
std::string conv2d_plan_description(Device device, const kernels::ConvGeom& g);

void pool2d_forward(Device device, cudaStream_t stream, kernels::PoolMode mode,
                    const kernels::PoolGeom& g, float* y, const float* x);
// Max pooling reads x and y; average pooling reads neither (pass null).
void pool2d_backward(Device device, cudaStream_t stream, kernels::PoolMode mode,
                     const kernels::PoolGeom& g, float* dx, const float* dy, const float* x,
                     const float* y, bool accumulate);
#endif

}  // namespace graphward::dnn
