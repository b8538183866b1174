#pragma once
// Seeded random numbers: Philox4x32-10, counter-based. Element i of a tensor drawn with seed s is a
// pure function of (s, i), so the same seed gives the same values on every device, for every
// shape with the same number of elements, and on every run. Values are generated on the host and
// copied to the device, so CPU and CUDA tensors are bitwise equal for a seed.
#include <array>
#include <cstdint>

namespace graphward {

// The 4 words of Philox4x32-10 for counter (c0, c1, 0, 0) and key (k0, k1).
std::array<std::uint32_t, 4> philox4x32(std::uint64_t counter, std::uint64_t key);

// Element i of a uniform [0, 1) stream with seed `seed`, with 53 random bits.
double philox_uniform(std::uint64_t seed, std::uint64_t i);
// Element i of a standard normal stream with seed `seed` (Box-Muller on one Philox block).
double philox_normal(std::uint64_t seed, std::uint64_t i);

}  // namespace graphward
