#pragma once
// The write-or-accumulate store shared by the CPU references (internal to kernels/).
#include <cstdint>

namespace graphward::kernels::cpu::detail {

template <class T>
inline void store(T* dst, std::int64_t i, T v, bool accumulate) {
  dst[i] = accumulate ? dst[i] + v : v;
}

}  // namespace graphward::kernels::cpu::detail
