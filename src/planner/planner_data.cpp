// dcp::PlannerData (see planner_data.h): the copy on write.
#include "dcp/planner_data.h"

#include <atomic>

namespace dcp {

PlannerData::PlannerData(Map map) {
  if (!map.empty()) map_ = std::make_shared<Map>(std::move(map));
}

PlannerData::PlannerData(std::initializer_list<value_type> entries)
    : PlannerData(Map(entries)) {}

PlannerData::Map& PlannerData::mutable_map() {
  if (!map_) {
    map_ = std::make_shared<Map>();
  } else if (map_.use_count() > 1) {
    // Another PlannerData holds the map too: this one takes a copy.
    map_ = std::make_shared<Map>(*map_);
  } else {
    // This object alone holds it, and the count cannot grow meanwhile: only a copy of this
    // object could share it. Another thread may just have dropped its copy, whose last reads
    // of the map must happen before this object's writes: use_count() is a relaxed load of
    // the count that drop decremented (a release), so an acquire fence orders them.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return *map_;
}

const PlannerData::Map& PlannerData::empty_map() {
  static const Map empty;
  return empty;
}

}  // namespace dcp
