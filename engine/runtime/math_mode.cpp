#include "graphward/engine/runtime/math_mode.h"

#include <atomic>

namespace graphward {

namespace {
std::atomic<bool> g_matmul_tf32{false};
std::atomic<bool> g_conv_tf32{false};
}  // namespace

void set_matmul_tf32(bool on) {
  g_matmul_tf32.store(on, std::memory_order_relaxed);
}
bool matmul_tf32() noexcept {
  return g_matmul_tf32.load(std::memory_order_relaxed);
}
void set_conv_tf32(bool on) {
  g_conv_tf32.store(on, std::memory_order_relaxed);
}
bool conv_tf32() noexcept {
  return g_conv_tf32.load(std::memory_order_relaxed);
}

namespace detail {
std::uint64_t math_mode_word() noexcept {
  return (matmul_tf32() ? 1u : 0u) | (conv_tf32() ? 2u : 0u);
}
const char* math_mode_str(std::uint64_t word) noexcept {
  switch (word & 3u) {
    case 0:
      return "TF32 off for matmul and conv";
    case 1:
      return "TF32 on for matmul, off for conv";
    case 2:
      return "TF32 off for matmul, on for conv";
    default:
      return "TF32 on for matmul and conv";
  }
}
}  // namespace detail

}  // namespace graphward
