#pragma once
// Marks memory as written for compute-sanitizer's initcheck, through NVTX's memory API: the marks
// graphward's GEMMs make after each launch (Note [GEMM outputs and initcheck], kernels/gemm.cu),
// here so that scripts/initcheck_probe.cu makes the same ones. Header-only, as NVTX3 is; present
// where the toolkit's nvtx3 headers are.
#if __has_include(<nvtx3/nvToolsExtMemCudaRt.h>)
#include <cstddef>

#include <nvtx3/nvToolsExtMemCudaRt.h>

namespace graphward::kernels {

// [p, p + bytes) is written by the work queued on `stream` before this call. A null `p` or zero
// `bytes` marks nothing. Without a tool attached, a pointer check.
inline void nvtx_mark_initialized(nvtxDomainHandle_t domain, const void* p, std::size_t bytes,
                                  cudaStream_t stream) {
  if (p == nullptr || bytes == 0) return;
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes;
  range.ptr = p;
  nvtxMemMarkInitializedBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemCudaMarkInitialized(domain, stream, 0, &batch);
}

}  // namespace graphward::kernels
#endif
