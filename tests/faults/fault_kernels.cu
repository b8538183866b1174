#include "faults/fault_kernels.h"

namespace graphward::testing {
namespace {
__global__ void trap_if_set(const float* flag) {
  if (*flag != 0.0f) __trap();
}
__global__ void spin_while_set(const volatile int* flag) {
  while (*flag != 0) __nanosleep(1000);
}
}  // namespace

void launch_spin_while_set(const volatile int* flag, cudaStream_t stream) {
  spin_while_set<<<1, 1, 0, stream>>>(flag);
}

void launch_trap_if_set(const float* flag, cudaStream_t stream) {
  trap_if_set<<<1, 1, 0, stream>>>(flag);
}

}  // namespace graphward::testing
