// Note [Code for the device]: a GPU the build has no code for is refused at its first use, by
// name, with the architectures built and the rebuild that fixes it; the build runs on this GPU.
#include <cuda_runtime_api.h>

#include <string>

#include "test_util.h"

namespace graphward {
namespace testing {
int sm80_only_probe();  // tests/runtime/no_code_probe.cu
}  // namespace testing
namespace {

constexpr Device kGpu = Device::cuda(0);

TEST(CudaDevice, TheBuildHasCodeForThisGpu) {
  GW_REQUIRE_GPU();
  EXPECT_NO_THROW(check_cuda_device(kGpu, "test"));
  EXPECT_NE(std::string(GRAPHWARD_CUDA_ARCHITECTURES), "");
  // Asked again, not from what check_cuda_device kept.
  EXPECT_NO_THROW(detail::check_device_code(
      kGpu, "test", [] { return static_cast<int>(cudaSuccess); }, GRAPHWARD_CUDA_ARCHITECTURES));
}

TEST(CudaDevice, AGpuWithoutCodeInTheBuildIsRefusedByNameWithTheFix) {
  GW_REQUIRE_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, kGpu.index), cudaSuccess);
  if (prop.major == 8) GTEST_SKIP() << "this GPU (compute capability 8.x) runs code built for 8.0";
  const std::string capability =
      "compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor);
  const std::string fix =
      "-DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(prop.major) + std::to_string(prop.minor);
  GW_EXPECT_ERROR(
      detail::check_device_code(kGpu, "Storage::allocate", testing::sm80_only_probe, "80-real"),
      "Storage::allocate: cuda:0 (", prop.name, capability,
      "cannot run graphward's kernels: this build has code for CUDA architectures 80-real", fix);
  // Nothing sticks: no CUDA error is left behind, and the library goes on working on the device.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(add(full({4}, 1.0, {DType::kFloat32, kGpu}), 2.0).to_vector<float>(),
            std::vector<float>(4, 3.f));
}

TEST(CudaDevice, AProbeThatCannotBeAnsweredNowIsReportedAsSuch) {
  GW_REQUIRE_GPU();
  GW_EXPECT_ERROR(
      detail::check_device_code(
          kGpu, "test", [] { return static_cast<int>(cudaErrorDevicesUnavailable); }, "90"),
      "test: cuda:0", "could not be asked whether it runs graphward's kernels",
      "cudaErrorDevicesUnavailable");
}

}  // namespace
}  // namespace graphward
