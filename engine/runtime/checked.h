#pragma once
// Checked int64 arithmetic for sizes (Note [Checked sizes], base/dtype.h): each returns whether
// the exact result fits, and writes it to *out only then. Header-only; no graphward dependency.
#include <cstdint>

namespace graphward::checked {

inline bool add(std::int64_t a, std::int64_t b, std::int64_t* out) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool sub(std::int64_t a, std::int64_t b, std::int64_t* out) {
  std::int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool mul(std::int64_t a, std::int64_t b, std::int64_t* out) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// Whether [start, start + length) lies within [0, size), with length >= min_length; no sum is
// formed, so no value of start or length can wrap.
inline bool window_fits(std::int64_t start, std::int64_t length, std::int64_t size,
                        std::int64_t min_length = 1) {
  return start >= 0 && length >= min_length && start <= size && length <= size - start;
}

}  // namespace graphward::checked
