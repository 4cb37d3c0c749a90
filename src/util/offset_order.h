// Chunk offsets in Python's order (None first, then lexicographic), as storage_data and
// de-duplication sort them, without the library calls std::vector's operators make: these
// compares run millions of times per save at scale.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "dcp/dims.h"

namespace dcp::detail {

using ChunkOffset = std::optional<Dims>;

/// <0, 0 or >0 as a sorts before, with or after b.
inline int compare_offsets(const ChunkOffset& a, const ChunkOffset& b) {
  if (!a || !b) return static_cast<int>(a.has_value()) - static_cast<int>(b.has_value());
  const size_t n = std::min(a->size(), b->size());
  for (size_t d = 0; d < n; ++d) {
    if ((*a)[d] != (*b)[d]) return (*a)[d] < (*b)[d] ? -1 : 1;
  }
  return a->size() == b->size() ? 0 : (a->size() < b->size() ? -1 : 1);
}

/// The head of a chunk offset, copied next to whatever sorts it: ordering millions of offsets
/// then rarely reaches into the item (or map entry) that holds the offset.
struct OffsetHead {
  int64_t lead = 0;  // offset[0] when kind == 2
  uint8_t kind = 0;  // 0: no offset, 1: empty offset, 2: non-empty (compare_offsets' order)

  static OffsetHead of(const ChunkOffset& offset) {
    if (!offset) return {0, 0};
    return offset->empty() ? OffsetHead{0, 1} : OffsetHead{offset->front(), 2};
  }
};

/// compare_offsets(a, b), where ha and hb are their heads.
inline int compare_offsets(OffsetHead ha, const ChunkOffset& a, OffsetHead hb,
                           const ChunkOffset& b) {
  if (ha.kind != hb.kind) return ha.kind < hb.kind ? -1 : 1;
  if (ha.lead != hb.lead) return ha.lead < hb.lead ? -1 : 1;
  return ha.kind == 2 ? compare_offsets(a, b) : 0;
}

}  // namespace dcp::detail
