#pragma once
// Marks memory as written for compute-sanitizer's initcheck, through NVTX's memory API (Note [GEMM
// outputs and initcheck], kernels/gemm.cu): mark_written, which the library's GEMMs and cuDNN's
// fused attention call after each launch; and nvtx_mark_initialized under it, here so that
// scripts/initcheck_probe.cu makes the same marks. The latter is header-only, as NVTX3 is; present
// where the toolkit's nvtx3 headers are.
#include <cstddef>

#include <cuda_runtime_api.h>

namespace graphward::kernels {

// [p, p + bytes) is written by the work queued on `stream` before this call: initcheck (with
// --nvtx yes) takes it as initialized from there on. A null `p` or zero `bytes` marks nothing;
// without a tool attached, a pointer check; in a build without NVTX, nothing.
void mark_written(const void* p, std::size_t bytes, cudaStream_t stream);

}  // namespace graphward::kernels

#if __has_include(<nvtx3/nvToolsExtMemCudaRt.h>)
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
