// dcp::Key and dcp::ObjectPath: how a leaf of a nested state dict is named before flattening.
// A path is the keys and list indices from the root to the leaf (Python DCP's OBJ_PATH); the
// default planners record each flat key's path in Metadata.planner_data.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace dcp {

/// A dict key. State dicts use strings; optimizer state and values written by Python may use
/// integers. Keys become strings in flattened names (Python's `str(key)`).
using Key = std::variant<std::string, int64_t>;

/// `str(key)` as Python prints it.
std::string key_to_string(const Key& key);

/// Python DCP's OBJ_PATH: the keys and list indices leading from the root to a leaf.
using ObjectPath = std::vector<Key>;

}  // namespace dcp
