// dcp::PlannerData (see planner_data.h): the copy on write.
#include "dcp/planner_data.h"

namespace dcp {

PlannerData::PlannerData(Map map) {
  if (!map.empty()) map_ = std::make_shared<Map>(std::move(map));
}

PlannerData::PlannerData(std::initializer_list<value_type> entries)
    : PlannerData(Map(entries)) {}

PlannerData::Map& PlannerData::mutable_map() {
  if (!map_) map_ = std::make_shared<Map>();
  // Another PlannerData holds the map too: this one takes a copy. A count of 1 cannot grow
  // meanwhile, since only a copy of this object could share it.
  else if (map_.use_count() > 1) map_ = std::make_shared<Map>(*map_);
  return *map_;
}

const PlannerData::Map& PlannerData::empty_map() {
  static const Map empty;
  return empty;
}

}  // namespace dcp
