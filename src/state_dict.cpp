// Value, Dict, and Python DCP's flatten_state_dict / set_element.
//
// Flattening (docs/format.md §6.1), for every top-level (key, value) with path (str(key),):
//   1. a dict is traversed; an empty dict emits nothing;
//   2. a list is traversed (children get int indices) only when it is "non-terminal": it holds
//      a tensor, a dict, or a non-terminal list; otherwise it is one leaf;
//   3. everything else (tuples included) is a leaf, keyed by its path joined with '.'.
#include "dcp/state_dict.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace dcp {

std::string key_to_string(const Key& key) {
  if (const auto* s = std::get_if<std::string>(&key)) return *s;
  return std::to_string(std::get<int64_t>(key));
}

// ---------------------------------------------------------------------------------------------
// Dict

Dict::Dict(std::initializer_list<Entry> entries) {
  for (const auto& e : entries) insert_or_assign(e.first, e.second);
}

Value& Dict::operator[](const Key& key) {
  auto it = index_.find(key);
  if (it != index_.end()) return entries_[it->second].second;
  index_.emplace(key, entries_.size());
  entries_.emplace_back(key, Value());
  return entries_.back().second;
}

Value& Dict::operator[](const char* key) { return (*this)[Key(std::string(key))]; }

Value& Dict::at(const Key& key) {
  Value* v = find(key);
  TORCH_CHECK(v != nullptr, "key '", key_to_string(key), "' not in dict");
  return *v;
}

const Value& Dict::at(const Key& key) const { return const_cast<Dict*>(this)->at(key); }

Value* Dict::find(const Key& key) {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const Key& key) const { return const_cast<Dict*>(this)->find(key); }

void Dict::insert_or_assign(Key key, Value value) { (*this)[key] = std::move(value); }

bool Dict::erase(const Key& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  return true;
}

bool operator==(const Dict& a, const Dict& b) {
  if (a.size() != b.size()) return false;
  auto ia = a.begin();
  for (auto ib = b.begin(); ib != b.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second != ib->second) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Value

const char* Value::type_name() const {
  return std::visit(
      [](const auto& v) { return type_name_of<std::decay_t<decltype(v)>>(); }, v_);
}

void Value::check_type(bool ok, const char* wanted) const {
  TORCH_CHECK(ok, "expected a value of type ", wanted, ", got ", type_name());
}

namespace {

bool tensors_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 || at::equal(a.cpu(), b.cpu()));
}

bool lists_equal(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace

bool operator==(const Value& a, const Value& b) {
  if (a.variant().index() != b.variant().index()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b.variant());
        if constexpr (std::is_same_v<T, at::Tensor>) return tensors_equal(x, y);
        else if constexpr (std::is_same_v<T, List>) return lists_equal(x, y);
        else if constexpr (std::is_same_v<T, Tuple>) return lists_equal(x.items, y.items);
        else return x == y;
      },
      a.variant());
}

namespace {

void print_key(std::ostream& os, const Key& k) {
  if (const auto* s = std::get_if<std::string>(&k)) os << "'" << *s << "'";
  else os << std::get<int64_t>(k);
}

void print_items(std::ostream& os, const std::vector<Value>& items) {
  for (size_t i = 0; i < items.size(); ++i) os << (i ? ", " : "") << items[i];
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, None>) os << "None";
        else if constexpr (std::is_same_v<T, bool>) os << (x ? "True" : "False");
        else if constexpr (std::is_same_v<T, std::string>) os << "'" << x << "'";
        else if constexpr (std::is_same_v<T, Bytes>) os << "b<" << x.data.size() << " bytes>";
        else if constexpr (std::is_same_v<T, at::Tensor>) {
          if (x.defined()) os << "Tensor(" << x.scalar_type() << ", " << x.sizes() << ")";
          else os << "Tensor(undefined)";
        } else if constexpr (std::is_same_v<T, ShardedTensor>) {
          os << "ShardedTensor(" << x.dtype() << ", " << c10::IntArrayRef(x.global_shape())
             << ", " << x.local_shards().size() << " local shards)";
        } else if constexpr (std::is_same_v<T, List>) {
          os << "[";
          print_items(os, x);
          os << "]";
        } else if constexpr (std::is_same_v<T, Tuple>) {
          os << "(";
          print_items(os, x.items);
          os << (x.items.size() == 1 ? ",)" : ")");
        } else if constexpr (std::is_same_v<T, Dict>) {
          os << "{";
          bool first = true;
          for (const auto& [k, val] : x) {
            os << (first ? "" : ", ");
            print_key(os, k);
            os << ": " << val;
            first = false;
          }
          os << "}";
        } else if constexpr (std::is_same_v<T, std::shared_ptr<Stateful>>) {
          os << "Stateful";
        } else {
          os << x;
        }
      },
      v.variant());
  return os;
}

// ---------------------------------------------------------------------------------------------
// Flattening

namespace {

bool is_terminal_list(const List& list) {
  for (const Value& v : list) {
    if (v.is_tensor() || v.is_sharded_tensor() || v.is_dict()) return false;
    if (v.is_list() && !is_terminal_list(v.list())) return false;
  }
  return true;
}

std::string join_path(const ObjectPath& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    out += key_to_string(path[i]);
  }
  return out;
}

void flatten_into(const Value& value, ObjectPath& path, FlatStateDict& out) {
  if (value.is_dict()) {
    for (const auto& [k, v] : value.dict()) {
      path.emplace_back(key_to_string(k));
      flatten_into(v, path, out);
      path.pop_back();
    }
    return;
  }
  if (value.is_list() && !is_terminal_list(value.list())) {
    const List& list = value.list();
    for (size_t i = 0; i < list.size(); ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      flatten_into(list[i], path, out);
      path.pop_back();
    }
    return;
  }
  std::string key = join_path(path);
  TORCH_CHECK_VALUE(!value.is_stateful(), "'", key, "' is a Stateful below the top level of the ",
                    "state dict; as in Python, save and load call Stateful objects only when they ",
                    "are top-level values");
  TORCH_CHECK_VALUE(out.mappings.count(key) == 0, "duplicated flatten key ", key);
  out.mappings.emplace(key, path);
  out.items.emplace_back(std::move(key), value);
}

}  // namespace

FlatStateDict flatten_state_dict(const StateDict& state) {
  FlatStateDict out;
  ObjectPath path;
  for (const auto& [k, v] : state) {
    path.assign(1, Key(key_to_string(k)));
    flatten_into(v, path, out);
  }
  return out;
}

namespace {

// The dict key to use for path item `item`: an existing key with the same str() if any.
Key resolve_dict_key(const Dict& dict, const Key& item) {
  if (dict.contains(item)) return item;
  const std::string text = key_to_string(item);
  for (const auto& entry : dict) {
    if (key_to_string(entry.first) == text) return entry.first;
  }
  return item;
}

}  // namespace

void set_element(StateDict& root, const ObjectPath& path, Value value) {
  TORCH_CHECK(!path.empty(), "set_element: empty path");
  Value* cur = nullptr;
  Dict* dict = &root;
  for (size_t i = 0; i < path.size(); ++i) {
    const Key& item = path[i];
    if (dict != nullptr) {
      cur = &(*dict)[resolve_dict_key(*dict, item)];
    } else {
      List& list = cur->list();
      TORCH_CHECK(std::holds_alternative<int64_t>(item), "set_element: list index expected at '",
                  join_path(path), "'");
      auto index = static_cast<size_t>(std::get<int64_t>(item));
      if (list.size() <= index) list.resize(index + 1);
      cur = &list[index];
    }
    if (i + 1 == path.size()) break;
    const bool next_is_index = std::holds_alternative<int64_t>(path[i + 1]);
    if (next_is_index) {
      if (!cur->is_list()) *cur = List{};
      dict = nullptr;
    } else {
      if (!cur->is_dict()) *cur = Dict{};
      dict = &cur->dict();
    }
  }
  *cur = std::move(value);
}

}  // namespace dcp
