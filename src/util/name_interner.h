// NameInterner: dense ids for the names of a save or a '.metadata', with a guess that makes the
// common orders cheap. Used by de-duplication, the global plan and storage_data's sort.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dcp::detail {

/// At scale names come in runs or cycles: every rank lists the same keys in the same order, and
/// storage entries sorted by key repeat a key once per rank, each time in a file named after
/// the rank. So the name after the previous one, then the previous one itself, are tried (a
/// string compare each) before the hash table. The views must outlive the interner.
/// Not thread-safe.
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

}  // namespace dcp::detail
