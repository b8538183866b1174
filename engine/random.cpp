#include "engine/random.h"

#include <cmath>
#include <numbers>

namespace graphward {

std::array<std::uint32_t, 4> philox4x32(std::uint64_t counter, std::uint64_t key) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(counter),
                c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kM0} * c0;
    const std::uint64_t p1 = std::uint64_t{kM1} * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32),
                        lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32),
                        lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
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
