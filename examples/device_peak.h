#pragma once
// The peak of the device memory a run's tensors took, for examples/train_gpt2 and
// bench/gpt2_bench.cpp: the high-water marks of the stream-ordered pool graphward allocates from
// (cudaMallocAsync's default pool) and of CUDA graphs' memory (a StepGraph's step). Library
// workspaces (cuBLAS's, cuDNN's) are not counted, as torch.cuda.max_memory_allocated counts
// PyTorch's tensors alone.
#include <cstdint>

#include "graphward/graphward.h"
#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::examples {

// Starts a new peak on `device` (nothing on the CPU).
inline void reset_device_peak(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda()) return;
  cudaMemPool_t pool;
  std::uint64_t zero = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, device.index) == cudaSuccess) {
    (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
  }
  (void)cudaDeviceSetGraphMemAttribute(device.index, cudaGraphMemAttrUsedMemHigh, &zero);
#else
  (void)device;
#endif
}

// MiB at the peak since the last reset; -1 where not measured (the CPU, or CUDA refused).
inline double device_peak_mib(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda()) return -1;
  cudaMemPool_t pool;
  std::uint64_t used = 0, graph = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, device.index) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used) != cudaSuccess ||
      cudaDeviceGetGraphMemAttribute(device.index, cudaGraphMemAttrUsedMemHigh, &graph) !=
          cudaSuccess) {
    return -1;
  }
  return static_cast<double>(used + graph) / (1 << 20);
#else
  (void)device;
  return -1;
#endif
}

}  // namespace graphward::examples
