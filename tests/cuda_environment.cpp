// The GPU test program's end: every block graphward's allocator keeps cached for reuse goes back
// to CUDA before main returns — before any exit handler, among them those of the CUDA runtimes
// that libraries (cuDNN) link statically — so that compute-sanitizer's leak check sees only memory
// that something still holds.
#include <gtest/gtest.h>

#include "engine/graphward.h"

namespace graphward {
namespace {

class ReleaseCachedMemory : public ::testing::Environment {
 public:
  void TearDown() override {
#if GRAPHWARD_HAS_CUDA
    if (!cuda_available()) return;
    DeviceGuard guard(Device::cuda(0));
    (void)cudaDeviceSynchronize();
    empty_cache(Device::cuda(0));
    (void)cudaDeviceSynchronize();
#endif
  }
};

[[maybe_unused]] ::testing::Environment* const kRelease =
    ::testing::AddGlobalTestEnvironment(new ReleaseCachedMemory);

}  // namespace
}  // namespace graphward
