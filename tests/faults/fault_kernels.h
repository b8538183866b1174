#pragma once
// A kernel that faults on purpose, for the tests of Note [Kernel faults] (base/error.h).
#include <cuda_runtime_api.h>

namespace graphward::testing {

// Launches one thread on `stream` that executes a trap (a sticky kernel fault: the process's CUDA
// context is lost) when `*flag` is not zero, and does nothing otherwise.
void launch_trap_if_set(const float* flag, cudaStream_t stream);

// Launches one thread on `stream` that spins while `*flag` (mapped host memory, written by the
// host) is not zero: a kernel that never finishes until the host lets it, as a collective waiting
// for a dead peer (Note [Replay watchdog], dist/watchdog.h).
void launch_spin_while_set(const volatile int* flag, cudaStream_t stream);

}  // namespace graphward::testing
