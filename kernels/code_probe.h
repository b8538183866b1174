#pragma once
// Whether this build's kernels can run on the current CUDA device (Note [Code for the device],
// engine/runtime/device.cpp).
#include "graphward/base/config.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>

namespace graphward::kernels {
// cudaFuncGetAttributes of a kernel compiled as every kernel of the library is, on the current
// device: cudaSuccess when the device can run them, else why not (no code for its architecture,
// PTX the driver cannot compile, ...). Leaves no error behind.
cudaError_t code_probe();
}  // namespace graphward::kernels
#endif
