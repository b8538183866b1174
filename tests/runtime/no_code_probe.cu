// A kernel built for compute capability 8.0 only (machine code, no PTX: tests/CMakeLists.txt), the
// way a graphward built for another GPU is: on a GPU of another major version it cannot run.
#include <cuda_runtime_api.h>

namespace graphward::testing {
namespace {
__global__ void sm80_only_kernel() {}
}  // namespace

int sm80_only_probe() {
  cudaFuncAttributes attributes{};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, sm80_only_kernel);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(err);
}
}  // namespace graphward::testing
