// The GPU test program's end: every block graphward's allocator keeps cached for reuse goes back
// to CUDA before main returns — before any exit handler, among them those of the CUDA runtimes
// that libraries (cuDNN) link statically — so that compute-sanitizer's leak check sees only memory
// that something still holds; and nothing may still hold any.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "graphward/graphward.h"
#include "test_util.h"

namespace graphward {
namespace {

class ReleaseCachedMemory : public ::testing::Environment {
 public:
  // GW_TEST_BLOCK_CACHE_OFF=1: the whole run without graphward's block cache (Note [Block cache]),
  // to tell the cache's part in what a sanitizer reports.
  void SetUp() override {
    const char* off = std::getenv("GW_TEST_BLOCK_CACHE_OFF");
    if (off && std::string(off) == "1") set_block_cache_limit(0);
  }
  // Every test's tensors are gone by now, so the CUDA pool must hold nothing once the cache is
  // empty: memory still in use here is held by something that outlived its test (a thread-local of
  // graphward's, say), and would be returned, if at all, only after the leak check.
  void TearDown() override {
#if GRAPHWARD_HAS_CUDA
    if (!cuda_available()) return;
    try {
      EXPECT_EQ(testing::pool_bytes_in_use(), 0u)
          << "bytes of the CUDA memory pool still in use after every test ended and graphward's "
             "block cache was emptied";
    } catch (const std::exception&) {
      // The pool cannot be read (a lost context): nothing to check here.
    }
#endif
  }
};

[[maybe_unused]] ::testing::Environment* const kRelease =
    ::testing::AddGlobalTestEnvironment(new ReleaseCachedMemory);

}  // namespace
}  // namespace graphward
