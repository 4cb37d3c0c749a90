// dcp::OrderedMap: a map that iterates in insertion order, like a Python dict. Metadata keeps its
// state_dict_metadata in one, so that a checkpoint's keys come back in the order Python DCP
// writes them (the order of the global plan), and `dcp_to_torch_save` or a load into an empty
// state dict rebuilds dicts in the order Python would.
//
// The interface is the subset of std::map's that dcp uses: find / at / count / contains,
// emplace / try_emplace / insert_or_assign / operator[], iteration over std::pair<const K, V>.
// Entries live in a std::deque, so references and pointers to them stay valid as entries are
// added (iterators do not). Lookups go through a hash index. There is no erase: rebuild instead.
// Equality is a dict's: the same keys with equal values, in any order.
//
// Thread-safety: none; plain data.
#pragma once

#include <c10/util/Exception.h>

#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace dcp {

template <typename K, typename V, typename Hash = std::hash<K>>
class OrderedMap {
 public:
  using key_type = K;
  using mapped_type = V;
  using value_type = std::pair<const K, V>;
  using iterator = typename std::deque<value_type>::iterator;
  using const_iterator = typename std::deque<value_type>::const_iterator;

  OrderedMap() = default;
  OrderedMap(std::initializer_list<value_type> entries) {
    for (const auto& e : entries) emplace(e.first, e.second);
  }
  OrderedMap(const OrderedMap& o) : entries_(o.entries_) { rebuild_index(); }
  OrderedMap(OrderedMap&& o) = default;
  OrderedMap& operator=(const OrderedMap& o) {
    if (this != &o) *this = OrderedMap(o);  // pairs with a const key cannot be assigned
    return *this;
  }
  OrderedMap& operator=(OrderedMap&& o) = default;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  iterator begin() { return entries_.begin(); }
  iterator end() { return entries_.end(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

  iterator find(const K& key) {
    auto it = index_.find(key);
    return it == index_.end() ? entries_.end() : entries_.begin() + it->second;
  }
  const_iterator find(const K& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? entries_.end() : entries_.begin() + it->second;
  }
  size_t count(const K& key) const { return index_.count(key); }
  bool contains(const K& key) const { return index_.count(key) != 0; }

  V& at(const K& key) {
    auto it = index_.find(key);
    if constexpr (std::is_convertible_v<const K&, std::string>) {
      TORCH_CHECK_INDEX(it != index_.end(), "no key '", std::string(key), "'");
    } else {
      TORCH_CHECK_INDEX(it != index_.end(), "OrderedMap::at: no such key");
    }
    return entries_[it->second].second;
  }
  const V& at(const K& key) const { return const_cast<OrderedMap*>(this)->at(key); }

  /// Inserts (key, value) at the end unless `key` is present; returns the entry and whether it
  /// was inserted, as std::map::emplace does.
  template <typename KK, typename... Args>
  std::pair<iterator, bool> try_emplace(KK&& key, Args&&... args) {
    auto found = index_.find(key);
    if (found != index_.end()) return {entries_.begin() + found->second, false};
    entries_.emplace_back(std::piecewise_construct, std::forward_as_tuple(std::forward<KK>(key)),
                          std::forward_as_tuple(std::forward<Args>(args)...));
    index_.emplace(entries_.back().first, entries_.size() - 1);
    return {std::prev(entries_.end()), true};
  }
  template <typename KK, typename VV>
  std::pair<iterator, bool> emplace(KK&& key, VV&& value) {
    return try_emplace(std::forward<KK>(key), std::forward<VV>(value));
  }
  template <typename VV>
  std::pair<iterator, bool> insert_or_assign(K key, VV&& value) {
    auto [it, inserted] = try_emplace(std::move(key), std::forward<VV>(value));
    if (!inserted) it->second = std::forward<VV>(value);
    return {it, inserted};
  }
  V& operator[](const K& key) { return try_emplace(key).first->second; }

  void clear() {
    entries_.clear();
    index_.clear();
  }

  /// A dict's equality: the same keys, each with an equal value; order does not matter.
  bool operator==(const OrderedMap& o) const {
    if (size() != o.size()) return false;
    for (const auto& [k, v] : entries_) {
      auto it = o.find(k);
      if (it == o.end() || !(it->second == v)) return false;
    }
    return true;
  }
  bool operator!=(const OrderedMap& o) const { return !(*this == o); }

 private:
  void rebuild_index() {
    index_.clear();
    index_.reserve(entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
  }

  std::deque<value_type> entries_;
  std::unordered_map<K, size_t, Hash> index_;
};

}  // namespace dcp
