// A consumer's own CUDA kernel on graphward's memory and stream (raw_data(), current_stream()),
// then graphward's ops on what it wrote: the .cu file compiles as C++20 with nothing of the
// consumer's own asking for it (the target brings it). Exits 77 where no CUDA device is usable
// (built, not run), 0 when the kernel's values came through, 1 otherwise.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include <graphward/graphward.h>
namespace gw = graphward;

__global__ void iota(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i);
}

int main() {
  static_assert(__cplusplus >= 202002L, "the target carries C++20 to nvcc");
  if (!gw::cuda_available()) {
    std::printf("kernel consumer: built as C++%ld; no CUDA device here, not run\n",
                static_cast<long>(__cplusplus / 100 % 100));
    return 77;
  }
  const gw::Device dev = gw::Device::cuda(0);
  constexpr int n = 1024;
  const gw::Tensor x = gw::Tensor::empty({n}, {gw::DType::kFloat32, dev});
  iota<<<(n + 255) / 256, 256, 0, gw::current_stream(dev)>>>(static_cast<float*>(x.raw_data()), n);
  GW_CUDA_CHECK(cudaGetLastError());
  const double got = gw::sum(gw::mul(x, x)).item();  // the same stream: ordered after the kernel
  const double want = (n - 1.0) * n * (2.0 * n - 1.0) / 6.0;
  const bool ok = std::abs(got - want) <= 1e-5 * want;
  std::printf("kernel consumer: sum of squares %.1f, expected %.1f: %s\n", got, want,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
