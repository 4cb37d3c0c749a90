// De-duplication of replicated save items (Python's dedup_save_plans, docs/format.md §6.2):
//   1. key = MetadataIndex (fqn, offset); walk distinct keys in first-seen order;
//   2. candidates = ranks whose plans contain the key;
//   3. keep it on the lowest candidate, or on the candidate with the fewest bytes so far;
//   4. that rank's total grows by the item's weight (global numel x element size, or 1 when
//      that is 0 (an empty tensor) or the item is bytes: Python's `tensor_storage_size() or 1`);
//   5. remove it from every other candidate's plan.
//
// At scale (a thousand ranks x thousands of tensors) almost every key is unique, so duplicates
// are found without a map over all keys: items are grouped by fqn (interned: usually one
// string compare per item, few distinct names) and sorted by offset inside each group. Only
// when a duplicate exists does the walk of step 2-5 run.
#include <algorithm>

#include "util/name_interner.h"
#include "util/offset_order.h"
#include "planner/planner_helpers.h"

namespace dcp::detail {
namespace {

// One item of a name's group, with the head of its offset copied in (the group's items lie in
// a thousand different plans: comparing them through the pointer would miss the cache twice).
struct Occurrence {
  const WriteItem* item;
  uint32_t rank;
  uint32_t pos;
  OffsetHead head;

  int compare(const Occurrence& o) const {
    return compare_offsets(head, item->index.offset, o.head, o.item->index.offset);
  }
};

int64_t weight_of(const WriteItem& item) {
  if (!item.tensor_data) return 1;
  auto weight = static_cast<int64_t>(c10::elementSize(item.tensor_data->properties.dtype));
  for (int64_t d : item.tensor_data->size) weight *= d;
  return weight == 0 ? 1 : weight;  // an empty tensor weighs 1, as in Python
}

}  // namespace

std::vector<SavePlan> dedup_save_plans(std::vector<SavePlan> plans, bool save_to_lowest_rank) {
  NameInterner group_of;
  std::vector<std::vector<Occurrence>> groups;
  for (size_t r = 0; r < plans.size(); ++r) {
    const auto& items = plans[r].items;
    for (size_t p = 0; p < items.size(); ++p) {
      auto [group, inserted] = group_of.intern(items[p].index.fqn);
      if (inserted) groups.emplace_back();
      groups[group].push_back(Occurrence{&items[p], static_cast<uint32_t>(r),
                                         static_cast<uint32_t>(p),
                                         OffsetHead::of(items[p].index.offset)});
    }
  }

  // A duplicated key: its occurrences in plan order (the first one is where it is first seen).
  std::vector<std::vector<Occurrence>> dups;
  for (auto& group : groups) {
    if (group.size() < 2) continue;
    // Ranks usually list a tensor's shards in offset order: sorting is then skipped.
    auto offset_less = [](const Occurrence& a, const Occurrence& b) { return a.compare(b) < 0; };
    if (!std::is_sorted(group.begin(), group.end(), offset_less)) {
      std::stable_sort(group.begin(), group.end(), offset_less);
    }
    for (size_t begin = 0; begin < group.size();) {
      size_t end = begin + 1;
      while (end < group.size() && group[end].compare(group[begin]) == 0) ++end;
      if (end - begin > 1) dups.emplace_back(group.begin() + begin, group.begin() + end);
      begin = end;
    }
  }
  if (dups.empty()) return plans;

  // dup_of[r][p]: which duplicated key plan r's item p is, or -1.
  std::vector<std::vector<int32_t>> dup_of(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) dup_of[r].assign(plans[r].items.size(), -1);
  for (size_t d = 0; d < dups.size(); ++d) {
    for (const auto& o : dups[d]) dup_of[o.rank][o.pos] = static_cast<int32_t>(d);
  }

  // Walk the distinct keys in first-seen order, balancing bytes over the candidates.
  std::vector<int64_t> totals(plans.size(), 0);
  std::vector<uint32_t> keep(dups.size(), 0);
  for (size_t r = 0; r < plans.size(); ++r) {
    const auto& items = plans[r].items;
    for (size_t p = 0; p < items.size(); ++p) {
      const int32_t d = dup_of[r][p];
      if (d < 0) {
        totals[r] += weight_of(items[p]);
        continue;
      }
      const auto& occurrences = dups[d];
      if (occurrences.front().rank != r || occurrences.front().pos != p) continue;
      uint32_t k = occurrences.front().rank;  // candidates ascend by rank
      if (!save_to_lowest_rank) {
        for (const auto& o : occurrences) {
          if (totals[o.rank] < totals[k]) k = o.rank;
        }
      }
      totals[k] += weight_of(items[p]);
      keep[d] = k;
    }
  }

  for (size_t r = 0; r < plans.size(); ++r) {
    auto& items = plans[r].items;
    size_t kept = 0;
    for (size_t p = 0; p < items.size(); ++p) {
      const int32_t d = dup_of[r][p];
      if (d >= 0 && keep[d] != r) continue;
      if (kept != p) items[kept] = std::move(items[p]);
      ++kept;
    }
    items.resize(kept);
  }
  return plans;
}

}  // namespace dcp::detail
