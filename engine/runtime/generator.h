#pragma once
// A random generator for dropout whose state — the seed and the offset (numbers drawn so far) —
// lives in device memory next to the tensors it serves: each draw reads the offset on the device
// and a tiny kernel advances it after, so a draw captured into a CUDA graph draws new numbers at
// every replay, and a generator made again with the same seed reproduces them (eagerly or
// replayed alike). Numbers are Philox4x32-10 of (seed, offset + i) (kernels/philox.h), the same
// on the CPU backend, so CPU and CUDA masks are bitwise equal for a seed.
#include <cstdint>

#include "graphward/engine/runtime/tensor.h"

namespace graphward {

class Generator {
 public:
  Generator(Device device, std::uint64_t seed);
  Device device() const { return state_.device(); }
  std::uint64_t seed() const { return seed_; }
  // Numbers drawn so far, read from the device (synchronizes; not inside a capture).
  std::uint64_t offset() const;
  // int32[4] on the device: the seed's and the offset's low and high words. Ops read and advance
  // it on the current stream (engine/ops/ops_dropout.cpp).
  const Tensor& state() const { return state_; }

 private:
  std::uint64_t seed_;
  Tensor state_;
};

}  // namespace graphward
