// De-duplication of replicated save items (Python's dedup_save_plans, reference §4.4):
//   1. key = MetadataIndex (fqn, offset); walk distinct keys in first-seen order;
//   2. candidates = ranks whose plans contain the key;
//   3. keep it on the lowest candidate, or on the candidate with the fewest bytes so far;
//   4. that rank's total grows by the item's weight (global numel x element size; 1 for bytes);
//   5. remove it from every other candidate's plan.
#include <algorithm>
#include <map>
#include <set>

#include "planner/planner_helpers.h"

namespace dcp::detail {

std::vector<SavePlan> dedup_save_plans(std::vector<SavePlan> plans, bool save_to_lowest_rank) {
  std::map<MetadataIndex, std::vector<size_t>> ranks_of;
  std::vector<const WriteItem*> first_seen;
  std::map<MetadataIndex, const WriteItem*> item_of;
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const auto& item : plans[r].items) {
      auto& ranks = ranks_of[item.index];
      if (ranks.empty()) first_seen.push_back(&item);
      ranks.push_back(r);
    }
  }
  std::vector<int64_t> totals(plans.size(), 0);
  std::vector<std::set<MetadataIndex>> removed(plans.size());
  for (const WriteItem* item : first_seen) {
    const auto& ranks = ranks_of[item->index];
    size_t keep = ranks.front();
    if (!save_to_lowest_rank) {
      for (size_t r : ranks) {
        if (totals[r] < totals[keep]) keep = r;
      }
    }
    int64_t weight = 1;
    if (item->tensor_data) {
      weight = static_cast<int64_t>(c10::elementSize(item->tensor_data->properties.dtype));
      for (int64_t d : item->tensor_data->size) weight *= d;
    }
    totals[keep] += weight;
    for (size_t r : ranks) {
      if (r != keep) removed[r].insert(item->index);
    }
  }
  for (size_t r = 0; r < plans.size(); ++r) {
    if (removed[r].empty()) continue;
    auto& items = plans[r].items;
    items.erase(std::remove_if(items.begin(), items.end(),
                               [&](const WriteItem& i) { return removed[r].count(i.index) > 0; }),
                items.end());
  }
  return plans;
}

}  // namespace dcp::detail
