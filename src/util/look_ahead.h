// LookAhead: a walk over a sequence that asks the CPU to fetch an element's heap blocks into the
// cache a few steps before the walk reaches it.
//
// Note [Look-ahead]: walks over millions of plan items, chunks or storage entries are bound by
// cache misses on the small heap blocks each one owns (its name, its offsets), not by
// instructions. Touching the element kLookAheadDistance steps ahead overlaps those misses
// with the work on the current one. It is used only where bench/coordinator_bench shows it
// pays: building storage_data (0.57-0.59 s with it, 0.60-0.69 s without, at 1024 ranks x 2000
// tensors). In the global plan it made no difference and in the metadata writer it cost 10%,
// so those loops are plain (docs/performance.md, "Look-ahead"). This is a CPU cache hint,
// unrelated to the disk read hints of the load path (Note [Prefetch]).
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>

namespace dcp::detail {

inline constexpr size_t kLookAheadDistance = 8;

/// Starts fetching the cache line at `p`; never faults.
inline void touch(const void* p) { __builtin_prefetch(p); }
/// Starts fetching the heap block of a string or vector (or of an optional one).
template <typename Container>
inline auto touch(const Container& c) -> decltype(c.data(), void()) {
  touch(static_cast<const void*>(c.data()));
}
template <typename Container>
inline void touch(const std::optional<Container>& c) {
  if (c) touch(*c);
}

/// The look-ahead of one walk over [begin, end): the walk calls step() once per element, in
/// order, and each call touches the element kLookAheadDistance places further on, if any.
///
///   LookAhead ahead(items.begin(), items.end());
///   for (const auto& item : items) {
///     ahead.step([](const Item& next) { touch(next.name); });
///     ...
///   }
template <typename It>
class LookAhead {
 public:
  LookAhead(It begin, It end) : ahead_(begin), end_(end) {
    for (size_t k = 0; k < kLookAheadDistance && ahead_ != end_; ++k) ++ahead_;
  }
  template <typename Touch>
  void step(Touch&& touch_element) {
    if (ahead_ == end_) return;
    touch_element(*ahead_);
    ++ahead_;
  }

 private:
  It ahead_;
  It end_;
};

}  // namespace dcp::detail
