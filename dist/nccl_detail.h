#pragma once
// Internal to dist/ (not part of the public API): what process_group.cpp and grad_reduction.cpp
// share — NCCL's error check and dtypes, and the batched copy of byte ranges.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graphward/base/dtype.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/kernels/shape.h"

#if GRAPHWARD_HAS_NCCL
#include <nccl.h>
#endif

namespace graphward::dist {

#if GRAPHWARD_HAS_NCCL
inline void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw Error(detail::concat("ProcessGroup: ", what, " failed: NCCL error ", static_cast<int>(r),
                             " (", ncclGetErrorString(r), ")",
                             last && *last ? detail::concat(": ", last) : std::string()));
}

inline ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kBFloat16:
      return ncclBfloat16;
  }
  throw Error("ProcessGroup: a dtype NCCL does not know");
}
#endif

#if GRAPHWARD_HAS_CUDA
// dist/'s gradient buckets: byte ranges copied kMaxSegments to a launch.
using SegmentCopier = kernels::SegmentCopier<kernels::kMaxSegments>;
#endif

}  // namespace graphward::dist
