// Checked integer arithmetic for sizes, offsets and counts that come from a file (a
// '.metadata', a record's data.pkl, a zip directory): nullopt instead of signed overflow, so a
// hostile value is reported rather than wrapping into an accepted one.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>

namespace dcp::detail {

inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// The product of `sizes` (1 for none); nullopt when a size is negative or the product
/// overflows int64.
inline std::optional<int64_t> checked_volume(c10::IntArrayRef sizes) {
  int64_t v = 1;
  for (int64_t s : sizes) {
    if (s < 0) return std::nullopt;
    auto next = checked_mul(v, s);
    if (!next) return std::nullopt;
    v = *next;
  }
  return v;
}

}  // namespace dcp::detail
