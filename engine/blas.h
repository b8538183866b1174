#pragma once
// cuBLAS handles for the calling thread. Each thread gets one handle per device (cuBLAS handles
// must not be used by two threads at once), created on first use with TF32 off (fp32 GEMMs are
// true fp32) and destroyed at thread exit. Each stream gets its own workspace (32 MiB, the size
// cuBLAS recommends for Hopper), so GEMMs on two streams never share scratch memory, and no GEMM
// ever asks cuBLAS to allocate: workspaces are allocated outside any capture, on first use of the
// stream, and launchers set them after every cublasSetStream (kernels/gemm.h). Streams are never
// destroyed (Note [Stream lifetime], stream.cpp), so two live streams never share a workspace.
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
