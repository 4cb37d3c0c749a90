// Internal helpers over dcp::Metadata shared by the save protocol, the global planner and the
// '.metadata' decoder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcp/metadata.h"

namespace dcp::detail {

/// Builds Metadata.storage_data from entries in any order; of equal keys the last one wins (as
/// repeated insert_or_assign would). Built from a sort on interned fqn ranks and offsets, then
/// hinted inserts, so millions of entries cost integer compares rather than string compares
/// per tree level.
std::map<MetadataIndex, StorageInfo> make_storage_data(
    std::vector<std::pair<MetadataIndex, StorageInfo>> entries);

/// Dense ids for the names of a save. At scale names come in runs or cycles: every rank lists
/// the same keys in the same order, and storage entries sorted by key repeat a key once per
/// rank, each time in a file named after the rank. So the name after the previous one, then
/// the previous one itself, are tried (a string compare each) before the hash table. The views
/// must outlive the interner.
class NameInterner {
 public:
  /// The name's id (0, 1, ... in first-seen order) and whether it is new.
  std::pair<uint32_t, bool> intern(std::string_view name) {
    const uint32_t next = last_ + 1 < names_.size() ? last_ + 1 : 0;
    if (next < names_.size() && names_[next] == name) return {last_ = next, false};
    if (last_ < names_.size() && names_[last_] == name) return {last_, false};
    auto [it, inserted] = ids_.try_emplace(name, static_cast<uint32_t>(names_.size()));
    if (inserted) names_.push_back(name);
    return {last_ = it->second, inserted};
  }
  /// Names by id.
  const std::vector<std::string_view>& names() const { return names_; }

 private:
  std::unordered_map<std::string_view, uint32_t> ids_;
  std::vector<std::string_view> names_;
  uint32_t last_ = UINT32_MAX;  // wraps to a first guess of 0
};

/// Walks over millions of plan items or storage entries are bound by cache misses on the
/// heap blocks each one owns (its name, its offsets). Loops fetch the entry this many steps
/// ahead while they work on the current one.
inline constexpr size_t kPrefetchDistance = 8;
inline void prefetch(const MetadataIndex& index) {
  __builtin_prefetch(index.fqn.data());
  if (index.offset) __builtin_prefetch(index.offset->data());
}
inline void prefetch(const ChunkStorageMetadata& chunk) {
  __builtin_prefetch(chunk.offsets.data());
  __builtin_prefetch(chunk.sizes.data());
}

/// Chunk offsets in Python's order (None first, then lexicographic), without the library
/// calls std::vector's operators make: these compares run millions of times per save.
inline int compare_offsets(const std::optional<std::vector<int64_t>>& a,
                           const std::optional<std::vector<int64_t>>& b) {
  if (!a || !b) return static_cast<int>(a.has_value()) - static_cast<int>(b.has_value());
  const size_t n = std::min(a->size(), b->size());
  for (size_t d = 0; d < n; ++d) {
    if ((*a)[d] != (*b)[d]) return (*a)[d] < (*b)[d] ? -1 : 1;
  }
  return a->size() == b->size() ? 0 : (a->size() < b->size() ? -1 : 1);
}

/// The head of a chunk offset, copied next to whatever sorts it: ordering millions of offsets
/// then rarely follows the pointer to the offset's own heap block.
struct OffsetHead {
  int64_t lead = 0;  // offset[0] when kind == 2
  uint8_t kind = 0;  // 0: no offset, 1: empty offset, 2: non-empty (compare_offsets' order)

  static OffsetHead of(const std::optional<std::vector<int64_t>>& offset) {
    if (!offset) return {0, 0};
    return offset->empty() ? OffsetHead{0, 1} : OffsetHead{offset->front(), 2};
  }
};

/// compare_offsets(a, b), where ha and hb are their heads.
inline int compare_offsets(OffsetHead ha, const std::optional<std::vector<int64_t>>& a,
                           OffsetHead hb, const std::optional<std::vector<int64_t>>& b) {
  if (ha.kind != hb.kind) return ha.kind < hb.kind ? -1 : 1;
  if (ha.lead != hb.lead) return ha.lead < hb.lead ? -1 : 1;
  return ha.kind == 2 ? compare_offsets(a, b) : 0;
}

}  // namespace dcp::detail
