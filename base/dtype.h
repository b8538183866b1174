#pragma once
// Element types and shapes. float32 is the type of every op on every device; float64 exists on the
// CPU backend for finite-difference gradient checks; int32 holds indices (class targets), read by
// the ops that take them and never differentiated; bfloat16 is a storage type with float32
// arithmetic: cast() converts to and from it (on both devices), and every op takes it, on CUDA
// and on the CPU backend (rounding as CUDA's: Note [bfloat16 on the CPU], engine/ops/ops_common.h) —
// statistics, sums and losses kept in float32 — and the optimizers through float32 masters
// (Note [Master weights], engine/backward/optim.h). Autocast (engine/ops/autocast.h) runs a float32 model's
// matrix products in bfloat16. float16 is not a dtype: it needs loss scaling, which
// graphward does not do. Tensors are contiguous and row-major.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include "graphward/base/config.h"
#include "graphward/base/shape.h"

namespace graphward {

enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32, kBFloat16 };

constexpr bool is_floating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kBFloat16;
}
// Whether `d` is one of the names above (an enum can hold any value of its type).
constexpr bool is_valid(DType d) {
  return static_cast<std::uint8_t>(d) <= static_cast<std::uint8_t>(DType::kBFloat16);
}

// Throws a graphward::Error naming a value that is none of DType's names ("DType(17)").
std::size_t dtype_size(DType dtype);
// "float32", "float64", "int32", "bfloat16"; "DType(17)" for a value that is none of them.
const char* dtype_name(DType dtype);

// A bfloat16 value as stored (the upper half of a float32: 1 sign, 8 exponent, 7 mantissa bits),
// bit-compatible with CUDA's __nv_bfloat16. from_float rounds to nearest, ties to even, as
// __float2bfloat16_rn does; a NaN becomes the canonical NaN 0x7FFF.
struct bf16 {
  std::uint16_t bits = 0;
  static constexpr bf16 from_float(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16{0x7FFF};
    const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(rounded >> 16)};
  }
  constexpr float to_float() const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::kBFloat16;
}

// "[2, 3]"; a scalar (0-d) shape prints as "[]".
std::string shape_str(const Shape& shape);
// Note [Checked sizes]
// Every size graphward computes from sizes it was given — elements, bytes, windows, offsets,
// convolution outputs — is computed with checked arithmetic (engine/runtime/checked.h): a size that
// does not fit in int64 (or a byte count past PTRDIFF_MAX, the most any allocation can hold) is
// refused with an Error naming the shape, before anything is allocated, never wrapped.
// Product of the dimensions (1 for a scalar). Throws on a negative dimension or overflow.
std::int64_t shape_numel(const Shape& shape);
// The bytes a tensor of `shape` and `dtype` holds. Throws when they exceed PTRDIFF_MAX.
std::size_t shape_nbytes(const Shape& shape, DType dtype);
// Whether a finite `value` stays finite in a float32 or bfloat16 tensor, or as the scalar of a
// kernel that computes in float32 (1e39 is a finite double and an infinite float): its magnitude
// is at most FLT_MAX. float64 and int32 take any finite value here.
bool finite_as(double value, DType dtype);

}  // namespace graphward
