#include "faults/fault_kernels.h"

namespace graphward::testing {
namespace {
__global__ void trap_if_set(const float* flag) {
  if (*flag != 0.0f) __trap();
}
}  // namespace

void launch_trap_if_set(const float* flag, cudaStream_t stream) {
  trap_if_set<<<1, 1, 0, stream>>>(flag);
}

}  // namespace graphward::testing
