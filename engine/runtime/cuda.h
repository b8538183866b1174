#pragma once
// The CUDA runtime's handle types. With the CUDA backend this is <cuda_runtime_api.h>; in a
// CPU-only build the opaque handle types are declared so that graphward's headers keep one
// signature.
#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
#endif
