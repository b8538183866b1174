#include "graphward/engine/runtime/random.h"

#include "graphward/kernels/philox.h"

#include <cmath>
#include <numbers>

namespace graphward {

std::array<std::uint32_t, 4> philox4x32(std::uint64_t counter, std::uint64_t key) {
  const kernels::Philox4 r = kernels::philox4x32_10(counter, key);  // shared with the device
  return {r.w[0], r.w[1], r.w[2], r.w[3]};
}

namespace {
double to_unit(std::uint32_t hi, std::uint32_t lo) {  // 53 bits -> [0, 1)
  const std::uint64_t bits = (std::uint64_t{hi} << 21) ^ (lo >> 11);
  return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}
}  // namespace

double philox_uniform(std::uint64_t seed, std::uint64_t i) {
  const auto w = philox4x32(i, seed);
  return to_unit(w[0], w[1]);
}

double philox_normal(std::uint64_t seed, std::uint64_t i) {
  const auto w = philox4x32(i, seed);
  const double u1 = 1.0 - to_unit(w[0], w[1]);  // (0, 1]: log is finite
  const double u2 = to_unit(w[2], w[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace graphward
