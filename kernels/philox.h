#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), the one function
// shared by the host (engine/runtime/random.cpp: seeded tensors) and the device (dropout's masks), so that
// a seed gives the same numbers on both.
#include <cstdint>

#if defined(__CUDACC__)
#define GW_HOST_DEVICE __host__ __device__
#else
#define GW_HOST_DEVICE
#endif

namespace graphward::kernels {

struct Philox4 {
  std::uint32_t w[4];
};

// The 4 words for counter (c0, c1, 0, 0) = `counter` and key (k0, k1) = `key`.
GW_HOST_DEVICE inline Philox4 philox4x32_10(std::uint64_t counter, std::uint64_t key) {
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
  return {{c0, c1, c2, c3}};
}

// Dropout's decision for element `i` of a draw at `offset` with `seed`: kept when a 24-bit uniform
// from the first word is >= p.
GW_HOST_DEVICE inline bool dropout_keep(std::uint64_t seed, std::uint64_t offset, std::uint64_t i,
                                        float p) {
  const Philox4 r = philox4x32_10(offset + i, seed);
  return static_cast<float>(r.w[0] >> 8) * 0x1.0p-24f >= p;
}

}  // namespace graphward::kernels
