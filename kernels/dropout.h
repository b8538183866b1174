#pragma once
// Dropout with a device-held Philox generator state (engine/runtime/generator.h), with its CPU reference.
// Same launcher contract as elementwise.h.
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

#if GRAPHWARD_HAS_CUDA
// With seed and offset read from state (int32[4]: seed lo, hi, offset lo, hi): mask[i] = keep ?
// 1/(1−p) : 0 (kernels/philox.h's dropout_keep(seed, offset, i, p)), y[i] = x[i]·mask[i]; then the
// offset advances by n (a second, one-thread kernel: replays draw new numbers). S: float or bf16,
// the storage of x and y; the mask is float32 either way (1/(1−p) exact as float32 math has it).
template <class S>
void dropout_forward(S* y, float* mask, const S* x, std::int32_t* state, std::int64_t n, float p,
                     cudaStream_t stream);
// The offset of state (as above) advanced by n on `stream` (one thread): for a draw made by
// another library's kernels from the same state (cuDNN's fused attention dropout).
void advance_offset(std::int32_t* state, std::int64_t n, cudaStream_t stream);
// dx = dy · mask (rounded once; the sum with dx's old value when `accumulate`) for bfloat16 dy
// and dx; float32 is elementwise.h's mul_backward.
void dropout_backward(bf16* dx, const bf16* dy, const float* mask, std::int64_t n, bool accumulate,
                      cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void dropout_forward(T* y, T* mask, const T* x, std::int32_t* state, std::int64_t n, float p);
}  // namespace cpu

}  // namespace graphward::kernels
