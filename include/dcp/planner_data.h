// dcp::PlannerData: SavePlan::planner_data, the part of a plan that belongs to its planner (the
// default planners keep Python's mappings there: each flat key's ObjectPath in the nested state
// dict). It is a std::map<std::string, ObjectPath> shared between copies until one of them is
// changed (copy on write).
//
// Why shared: the coordinator of a save holds every rank's plan, and the ranks of one model send
// the same mappings. At 1024 ranks x 2,000 tensors a map per rank is 2 million entries, about
// 400 MiB and half a second of decoding; dcp::save's coordinator gives ranks whose mappings are
// byte for byte the previous rank's that rank's map (detail::decode_save_plans), and the
// global plan merges a shared map once.
//
// Reading never copies. Every call that can change the map (emplace, insert_or_assign, [],
// erase, clear, mutable_map) first copies it when another PlannerData shares it, so a change
// is never seen through another plan. Iteration is const: change values through
// mutable_map().
//
// Thread-safety: as std::shared_ptr's. Distinct PlannerData objects may be used from different
// threads, even when they share a map (a change copies first, and the count is atomic); one
// object used from several threads needs the caller's synchronization.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "dcp/object_path.h"

namespace dcp {

class PlannerData {
 public:
  using Map = std::map<std::string, ObjectPath>;
  using key_type = std::string;
  using mapped_type = ObjectPath;
  using value_type = Map::value_type;
  using size_type = size_t;
  using const_iterator = Map::const_iterator;
  using iterator = const_iterator;  // iteration is const (see above)

  PlannerData() = default;
  /// Takes `map` (implicit, so that `plan.planner_data = mappings;` reads as it does in Python).
  PlannerData(Map map);  // NOLINT(google-explicit-constructor)
  PlannerData(std::initializer_list<value_type> entries);

  // Reading.
  const Map& map() const { return map_ ? *map_ : empty_map(); }
  const_iterator begin() const { return map().begin(); }
  const_iterator end() const { return map().end(); }
  size_t size() const { return map_ ? map_->size() : 0; }
  bool empty() const { return size() == 0; }
  const_iterator find(const std::string& key) const { return map().find(key); }
  size_t count(const std::string& key) const { return map().count(key); }
  bool contains(const std::string& key) const { return map().count(key) != 0; }
  /// Throws std::out_of_range when `key` is absent, as std::map::at does.
  const ObjectPath& at(const std::string& key) const { return map().at(key); }
  /// Whether this and `other` share one map: then they are equal without a comparison.
  bool shares_with(const PlannerData& other) const {
    return map_ != nullptr && map_ == other.map_;
  }

  // Changing: each first makes the map this object's own.
  Map& mutable_map();
  template <class... Args>
  std::pair<Map::iterator, bool> emplace(Args&&... args) {
    return mutable_map().emplace(std::forward<Args>(args)...);
  }
  std::pair<Map::iterator, bool> insert_or_assign(const std::string& key, ObjectPath path) {
    return mutable_map().insert_or_assign(key, std::move(path));
  }
  ObjectPath& operator[](const std::string& key) { return mutable_map()[key]; }
  size_t erase(const std::string& key) { return map_ ? mutable_map().erase(key) : 0; }
  void clear() { map_.reset(); }

  friend bool operator==(const PlannerData& a, const PlannerData& b) {
    return a.map_ == b.map_ || a.map() == b.map();
  }
  friend bool operator!=(const PlannerData& a, const PlannerData& b) { return !(a == b); }

 private:
  static const Map& empty_map();

  std::shared_ptr<Map> map_;  // null: empty
};

}  // namespace dcp
