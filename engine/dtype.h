#pragma once
// Element types and shapes. float32 is the type of every op on every device; float64 exists on the
// CPU backend for finite-difference gradient checks; int32 holds indices (class targets), read by
// the ops that take them and never differentiated. Tensors are contiguous and row-major.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace graphward {

enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32 };

constexpr bool is_floating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64;
}

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "float64", "int32"

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

using Shape = std::vector<std::int64_t>;

// "[2, 3]"; a scalar (0-d) shape prints as "[]".
std::string shape_str(const Shape& shape);
// Product of the dimensions (1 for a scalar). Throws on a negative dimension or overflow.
std::int64_t shape_numel(const Shape& shape);

}  // namespace graphward
