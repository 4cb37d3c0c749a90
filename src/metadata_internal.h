// Internal helpers over dcp::Metadata shared by the save protocol, the global planner and the
// '.metadata' decoder.
#pragma once

#include <cstdint>
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

}  // namespace dcp::detail
