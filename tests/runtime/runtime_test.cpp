// The runtime on a machine that may have no GPU: device queries answer cleanly, CUDA requests
// fail with a clear error rather than a crash.
#include "test_util.h"

#if GRAPHWARD_HAS_CUDA
#include <cublas_v2.h>
#endif

namespace graphward {
namespace {

TEST(Runtime, DeviceQueryAnswersWithoutFailing) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  if (n == 0) {
    EXPECT_FALSE(cuda_unavailable_reason().empty());
  } else {
    EXPECT_TRUE(cuda_unavailable_reason().empty());
  }
}

TEST(Runtime, CudaTensorWithoutAGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this pins the no-GPU behaviour";
  GW_EXPECT_ERROR(zeros({2}, {DType::kFloat32, Device::cuda(0)}), "cuda:0", "no CUDA device");
  GW_EXPECT_ERROR(ones({2}).to(Device::cuda()), "no CUDA device");
  GW_EXPECT_ERROR(current_stream(Device::cuda()), "current_stream", "no CUDA device");
  // The library still works on the CPU afterwards.
  EXPECT_EQ(sum(ones({3})).item(), 3.0);
}

TEST(Runtime, NonexistentDeviceIsAClearError) {
  const int n = cuda_device_count();
  GW_EXPECT_ERROR(zeros({2}, {DType::kFloat32, Device::cuda(n + 3)}),
                  "cuda:" + std::to_string(n + 3));
}

TEST(Runtime, DeviceNames) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_NE(Device::cpu(), Device::cuda(0));
}

TEST(Runtime, CheckMacroMessageHasTheContext) {
  try {
    GW_CHECK(1 + 1 == 3, "arithmetic: got ", 2, ", expected ", 3);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("arithmetic: got 2, expected 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("runtime_test.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 + 1 == 3"), std::string::npos) << msg;
  }
}

#if GRAPHWARD_HAS_CUDA
TEST(Runtime, CudaCheckNamesTheErrorAndTheExpression) {
  try {
    GW_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL();
  } catch (const CudaError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), static_cast<int>(cudaErrorInvalidValue));
    EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
    EXPECT_NE(msg.find("runtime_test.cpp:"), std::string::npos) << msg;
  }
  try {
    GW_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL();
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos);
  }
}
#endif

}  // namespace
}  // namespace graphward
