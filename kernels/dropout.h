#pragma once
// Dropout with a device-held Philox generator state (runtime/generator.h), with its CPU reference.
// Same launcher contract as elementwise.h.
#include <cstdint>
#include "base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// With seed and offset read from state (int32[4]: seed lo, hi, offset lo, hi): mask[i] = keep ?
// 1/(1−p) : 0 (kernels/philox.h's dropout_keep(seed, offset, i, p)), y[i] = x[i]·mask[i]; then the
// offset advances by n (a second, one-thread kernel: replays draw new numbers).
void dropout_forward(float* y, float* mask, const float* x, std::int32_t* state, std::int64_t n,
                     float p, cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void dropout_forward(T* y, T* mask, const T* x, std::int32_t* state, std::int64_t n, float p);
}  // namespace cpu

}  // namespace graphward::kernels
