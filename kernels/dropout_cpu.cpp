// CPU reference of the dropout kernel (the same Philox decisions as the device).
#include "graphward/kernels/dropout.h"
#include "graphward/kernels/philox.h"

namespace graphward::kernels::cpu {

namespace {
std::uint64_t word64(const std::int32_t* s) {
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[0])) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(s[1])) << 32);
}
}  // namespace

template <class T>
void dropout_forward(T* y, T* mask, const T* x, std::int32_t* state, std::int64_t n, float p) {
  const std::uint64_t seed = word64(state), offset = word64(state + 2);
  const T scale = T(1) / (T(1) - static_cast<T>(p));
  for (std::int64_t i = 0; i < n; ++i) {
    const T m = dropout_keep(seed, offset, static_cast<std::uint64_t>(i), p) ? scale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
  const std::uint64_t next = offset + static_cast<std::uint64_t>(n);
  state[2] = static_cast<std::int32_t>(static_cast<std::uint32_t>(next));
  state[3] = static_cast<std::int32_t>(static_cast<std::uint32_t>(next >> 32));
}

template void dropout_forward<float>(float*, float*, const float*, std::int32_t*, std::int64_t,
                                     float);
template void dropout_forward<double>(double*, double*, const double*, std::int32_t*,
                                      std::int64_t, float);

}  // namespace graphward::kernels::cpu
