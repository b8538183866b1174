#pragma once
// A kernel that faults on purpose, for the tests of Note [Kernel faults] (base/error.h).
#include <cuda_runtime_api.h>

namespace graphward::testing {

// Launches one thread on `stream` that executes a trap (a sticky kernel fault: the process's CUDA
// context is lost) when `*flag` is not zero, and does nothing otherwise.
void launch_trap_if_set(const float* flag, cudaStream_t stream);

}  // namespace graphward::testing
