#pragma once
// cuBLAS handles for the calling thread: one per (thread, device, stream), created on first use
// with TF32 off (fp32 GEMMs are true fp32), bound once to its stream and to a workspace of its own
// (32 MiB, the size cuBLAS recommends for Hopper), and destroyed at thread exit. cuBLAS handles
// must not be used by two threads at once; GEMMs on two streams never share scratch memory; no GEMM
// ever asks cuBLAS to allocate (workspaces are allocated outside any capture, on a stream's first
// GEMM); and no GEMM pays host time for cublasSetStream/cublasSetWorkspace. Streams are never destroyed (Note [Stream lifetime], stream.cpp),
// so a handle keyed by a stream never outlives it.
#include <cstddef>

#include "engine/cuda.h"
#include "engine/device.h"

#if GRAPHWARD_HAS_CUDA
#include "kernels/gemm.h"
#endif

namespace graphward {

inline constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;

#if GRAPHWARD_HAS_CUDA
// The calling thread's cuBLAS handle for `device` with the workspace of `stream`.
kernels::BlasContext blas_context(Device device, cudaStream_t stream);
#endif

}  // namespace graphward
