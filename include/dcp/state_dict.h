// dcp::Value and dcp::StateDict: the nested, ordered, name-to-value trees that dcp::save writes
// and dcp::load fills, with the same shape Python DCP accepts (tensors, nested dicts, lists,
// tuples and plain Python values), plus the flattening to dotted keys that Python DCP applies
// (docs/format.md §6.1), so that keys match across languages.
//
// Thread-safety: values are plain data; concurrent reads are safe, writes need external locking.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dcp/object_path.h"
#include "dcp/sharded_tensor.h"

namespace dcp {

class Value;
class Stateful;  // dcp/stateful.h

/// Python's None.
struct None {
  bool operator==(const None&) const { return true; }
};

/// Python's `bytes`: raw bytes, as distinct from a text string.
struct Bytes {
  std::string data;
  bool operator==(const Bytes& other) const { return data == other.data; }
};

/// Python's list.
using List = std::vector<Value>;

/// Python's tuple. Always a leaf when flattening (saved as one byte item), as in Python DCP.
struct Tuple {
  std::vector<Value> items;
};

/// An insertion-ordered dict, like Python's. Lookups are O(log n).
class Dict {
 public:
  using Entry = std::pair<Key, Value>;
  using iterator = std::vector<Entry>::iterator;
  using const_iterator = std::vector<Entry>::const_iterator;

  Dict() = default;
  Dict(std::initializer_list<Entry> entries);

  /// Returns the value under `key`, inserting None first when absent.
  Value& operator[](const Key& key);
  Value& operator[](const char* key);
  /// Returns the value under `key`; throws c10::Error naming the key when absent.
  Value& at(const Key& key);
  const Value& at(const Key& key) const;
  Value* find(const Key& key);
  const Value* find(const Key& key) const;
  bool contains(const Key& key) const { return index_.count(key) != 0; }
  void insert_or_assign(Key key, Value value);
  /// Removes `key`; returns whether it was present. O(n).
  bool erase(const Key& key);

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  iterator begin() { return entries_.begin(); }
  iterator end() { return entries_.end(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::map<Key, size_t> index_;
};

/// What dcp::save takes and dcp::load fills: a nested, ordered dict.
using StateDict = Dict;

/// One value of a state dict: a tensor (whole, or this rank's shards of a global tensor), a
/// container, or a plain Python value.
class Value {
 public:
  using Variant = std::variant<None, bool, int64_t, double, std::string, Bytes, at::Tensor,
                               ShardedTensor, List, Tuple, Dict, std::shared_ptr<Stateful>>;

  Value() = default;
  Value(None v) : v_(v) {}
  Value(bool v) : v_(v) {}
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T v) : v_(static_cast<int64_t>(v)) {}
  Value(double v) : v_(v) {}
  Value(float v) : v_(static_cast<double>(v)) {}
  Value(const char* v) : v_(std::string(v)) {}
  Value(std::string v) : v_(std::move(v)) {}
  Value(Bytes v) : v_(std::move(v)) {}
  Value(at::Tensor v) : v_(std::move(v)) {}
  Value(ShardedTensor v) : v_(std::move(v)) {}
  Value(List v) : v_(std::move(v)) {}
  Value(Tuple v) : v_(std::move(v)) {}
  Value(Dict v) : v_(std::move(v)) {}
  /// An object that gives and takes its own state (dcp/stateful.h); allowed at the top level
  /// of a state dict only, as in Python. Shared: save and load call it, the caller keeps it.
  template <typename T, std::enable_if_t<std::is_base_of_v<Stateful, T>, int> = 0>
  Value(std::shared_ptr<T> v) : v_(std::shared_ptr<Stateful>(std::move(v))) {}

  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(v_);
  }
  bool is_none() const { return is<None>(); }
  bool is_tensor() const { return is<at::Tensor>(); }
  bool is_sharded_tensor() const { return is<ShardedTensor>(); }
  bool is_dict() const { return is<Dict>(); }
  bool is_list() const { return is<List>(); }
  bool is_stateful() const { return is<std::shared_ptr<Stateful>>(); }

  /// Typed access; throws c10::Error naming both types when the value holds another type.
  template <typename T>
  T& get() {
    check_type(std::holds_alternative<T>(v_), type_name_of<T>());
    return std::get<T>(v_);
  }
  template <typename T>
  const T& get() const {
    check_type(std::holds_alternative<T>(v_), type_name_of<T>());
    return std::get<T>(v_);
  }
  at::Tensor& tensor() { return get<at::Tensor>(); }
  const at::Tensor& tensor() const { return get<at::Tensor>(); }
  Dict& dict() { return get<Dict>(); }
  const Dict& dict() const { return get<Dict>(); }
  List& list() { return get<List>(); }
  const List& list() const { return get<List>(); }

  /// The Python type name of the held value ("int", "float", "Tensor", "dict", ...).
  const char* type_name() const;

  const Variant& variant() const { return v_; }
  Variant& variant() { return v_; }

 private:
  template <typename T>
  static const char* type_name_of();
  void check_type(bool ok, const char* wanted) const;

  Variant v_;
};

/// Deep equality: tensors compare by dtype, shape and bytes (torch::equal), containers
/// element-wise, doubles by value.
bool operator==(const Value& a, const Value& b);
inline bool operator!=(const Value& a, const Value& b) { return !(a == b); }
bool operator==(const Dict& a, const Dict& b);
/// A short, Python-like rendering for messages and tests (tensors print as their shape).
std::ostream& operator<<(std::ostream& os, const Value& v);

/// A state dict flattened to dotted keys (Python `flatten_state_dict`), with each key's path.
/// Leaves are copies of the original values; tensors share storage with the originals, so
/// writing into a flat tensor writes into the caller's tensor.
struct FlatStateDict {
  std::vector<std::pair<std::string, Value>> items;  // in traversal order
  std::map<std::string, ObjectPath> mappings;         // flat key -> path (Metadata.planner_data)
};

/// Flattens with Python DCP's rules (docs/format.md §6.1): dicts are always traversed (empty dicts
/// vanish), lists only when they hold a tensor, a dict or such a list; tuples and everything
/// else are leaves; keys are joined with '.'. Throws c10::ValueError on a duplicated flat key
/// and on a Stateful (save and load resolve those at the top level before flattening).
FlatStateDict flatten_state_dict(const StateDict& state);

/// Python `set_element`: stores `value` at `path` inside `root`, creating dicts and growing
/// lists as needed. A dict key that exists as an int whose decimal form equals a string path
/// item is reused, so optimizer-style int keys keep their type.
void set_element(StateDict& root, const ObjectPath& path, Value value);

}  // namespace dcp

// Out-of-line template definitions that need Value complete.
namespace dcp {
template <typename T>
const char* Value::type_name_of() {
  if constexpr (std::is_same_v<T, None>) return "None";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, int64_t>) return "int";
  else if constexpr (std::is_same_v<T, double>) return "float";
  else if constexpr (std::is_same_v<T, std::string>) return "str";
  else if constexpr (std::is_same_v<T, Bytes>) return "bytes";
  else if constexpr (std::is_same_v<T, at::Tensor>) return "Tensor";
  else if constexpr (std::is_same_v<T, ShardedTensor>) return "ShardedTensor";
  else if constexpr (std::is_same_v<T, List>) return "list";
  else if constexpr (std::is_same_v<T, Tuple>) return "tuple";
  else if constexpr (std::is_same_v<T, Dict>) return "dict";
  else return "Stateful";
}
}  // namespace dcp
