// dcp::FlatMap: a sorted map kept as one array of entries, in blocks (boost::container::
// flat_map's idea, with std::deque's storage). Metadata keeps its storage_data in one: a
// checkpoint at scale has millions of entries, and a std::map spends a heap block of about 200
// bytes on each, which its builders, decoders and teardown paid for (docs/performance.md,
// "storage_data in blocks").
//
// Why blocks and not one std::vector: growing never moves the entries (a vector doubles and
// moves everything, with both copies alive at once), and every block is far below the size at
// which malloc maps fresh pages from the kernel, so a map built after other work reuses the
// memory that work freed. Each block holds a power of two of entries, at most 32 KiB of them
// (128 entries, 22.5 KiB, for storage_data).
//
// The interface is the subset of std::map's that dcp and its users need: find / at / count /
// contains / lower_bound, emplace / try_emplace / emplace_hint / insert_or_assign /
// operator[], erase, iteration in key order over std::pair<K, V> (random-access iterators).
// Differences from std::map:
// - the key of an entry reached through an iterator is not const; changing it breaks the
//   order (and find): rebuild instead;
// - inserting anywhere but after the last key moves the entries behind it (O(n)), and any
//   insertion or erasure invalidates iterators, references and pointers to entries. Build
//   large maps in key order (append, or emplace in key order, costs one comparison), or
//   collect the entries and build the map with `from_unsorted` (any order; O(n log n)) or
//   `from_sorted` (sorted and unique; checked);
// - `release` hands back the entries, for a caller that re-sorts them.
//
// Thread-safety: plain data; concurrent const use is safe, as with std::map.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace dcp {

template <typename K, typename V, typename Less = std::less<K>>
class FlatMap {
 public:
  using key_type = K;
  using mapped_type = V;
  using value_type = std::pair<K, V>;

 private:
  static constexpr size_t kBlockTarget = 32 * 1024;
  static constexpr size_t shift_for(size_t per_block) {
    size_t shift = 0;
    while ((size_t{2} << shift) <= per_block) ++shift;
    return shift;
  }
  static constexpr size_t kShift =
      shift_for(std::max<size_t>(1, kBlockTarget / sizeof(value_type)));
  static constexpr size_t kPerBlock = size_t{1} << kShift;
  static constexpr size_t kMask = kPerBlock - 1;

  template <bool kConst>
  class Iter {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = FlatMap::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = std::conditional_t<kConst, const value_type*, value_type*>;
    using reference = std::conditional_t<kConst, const value_type&, value_type&>;

    Iter() = default;
    template <bool kOther, typename = std::enable_if_t<kConst && !kOther>>
    Iter(const Iter<kOther>& o) : blocks_(o.blocks_), i_(o.i_) {}  // NOLINT: as std's

    reference operator*() const { return blocks_[i_ >> kShift][i_ & kMask]; }
    pointer operator->() const { return &**this; }
    reference operator[](difference_type n) const { return *(*this + n); }
    Iter& operator++() { return ++i_, *this; }
    Iter& operator--() { return --i_, *this; }
    Iter operator++(int) { Iter t = *this; ++i_; return t; }
    Iter operator--(int) { Iter t = *this; --i_; return t; }
    Iter& operator+=(difference_type n) { return i_ += n, *this; }
    Iter& operator-=(difference_type n) { return i_ -= n, *this; }
    friend Iter operator+(Iter it, difference_type n) { return it += n; }
    friend Iter operator+(difference_type n, Iter it) { return it += n; }
    friend Iter operator-(Iter it, difference_type n) { return it -= n; }
    friend difference_type operator-(const Iter& a, const Iter& b) {
      return static_cast<difference_type>(a.i_) - static_cast<difference_type>(b.i_);
    }
    friend bool operator==(const Iter& a, const Iter& b) { return a.i_ == b.i_; }
    friend bool operator!=(const Iter& a, const Iter& b) { return a.i_ != b.i_; }
    friend bool operator<(const Iter& a, const Iter& b) { return a.i_ < b.i_; }
    friend bool operator>(const Iter& a, const Iter& b) { return a.i_ > b.i_; }
    friend bool operator<=(const Iter& a, const Iter& b) { return a.i_ <= b.i_; }
    friend bool operator>=(const Iter& a, const Iter& b) { return a.i_ >= b.i_; }

   private:
    friend class FlatMap;
    template <bool>
    friend class Iter;
    Iter(value_type* const* blocks, size_t i) : blocks_(blocks), i_(i) {}
    value_type* const* blocks_ = nullptr;
    size_t i_ = 0;
  };

 public:
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  FlatMap() = default;
  FlatMap(std::initializer_list<value_type> entries) {
    for (const auto& e : entries) emplace(e.first, e.second);
  }
  FlatMap(const FlatMap& o) {
    reserve(o.size());
    for (const auto& e : o) construct_back(e);
  }
  FlatMap(FlatMap&& o) noexcept : blocks_(std::move(o.blocks_)), size_(o.size_) {
    o.blocks_.clear();
    o.size_ = 0;
  }
  FlatMap& operator=(const FlatMap& o) {
    if (this != &o) *this = FlatMap(o);
    return *this;
  }
  FlatMap& operator=(FlatMap&& o) noexcept {
    if (this != &o) {
      free_all();
      blocks_ = std::move(o.blocks_);
      size_ = o.size_;
      o.blocks_.clear();
      o.size_ = 0;
    }
    return *this;
  }
  ~FlatMap() { free_all(); }

  /// Adopts entries sorted by key with no two keys equal; checks that they are.
  static FlatMap from_sorted(std::vector<value_type> entries) {
    FlatMap out;
    out.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      TORCH_CHECK(out.append(std::move(entries[i].first), std::move(entries[i].second)),
                  "FlatMap::from_sorted: entries ", i - 1, " and ", i,
                  " are out of order or equal");
    }
    return out;
  }

  /// Builds the map from entries in any order in O(n log n); of equal keys, the last one
  /// wins (as repeated insert_or_assign would). The way to build a large map whose keys do
  /// not come in order.
  static FlatMap from_unsorted(std::vector<value_type> entries) {
    std::vector<size_t> order(entries.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return Less()(entries[a].first, entries[b].first);
    });
    FlatMap out;
    out.reserve(entries.size());
    for (size_t k = 0; k < order.size(); ++k) {
      if (k + 1 < order.size() &&
          !Less()(entries[order[k]].first, entries[order[k + 1]].first)) {
        continue;  // a later entry has the same key
      }
      out.construct_back(std::move(entries[order[k]]));
    }
    return out;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  /// Makes room for `n` entries in all, so that adding them allocates nothing more.
  void reserve(size_t n) {
    blocks_.reserve((n + kMask) >> kShift);
    while (capacity() < n) add_block();
  }
  void clear() {
    destroy_from(0);
  }
  iterator begin() { return iterator(blocks_.data(), 0); }
  iterator end() { return iterator(blocks_.data(), size_); }
  const_iterator begin() const { return const_iterator(blocks_.data(), 0); }
  const_iterator end() const { return const_iterator(blocks_.data(), size_); }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }

  /// The first entry whose key is not less than `key`.
  iterator lower_bound(const K& key) {
    return std::lower_bound(begin(), end(), key, KeyLess());
  }
  const_iterator lower_bound(const K& key) const {
    return std::lower_bound(begin(), end(), key, KeyLess());
  }
  iterator find(const K& key) {
    auto it = lower_bound(key);
    return it != end() && !Less()(key, it->first) ? it : end();
  }
  const_iterator find(const K& key) const {
    auto it = lower_bound(key);
    return it != end() && !Less()(key, it->first) ? it : end();
  }
  size_t count(const K& key) const { return find(key) != end() ? 1 : 0; }
  bool contains(const K& key) const { return find(key) != end(); }

  V& at(const K& key) {
    auto it = find(key);
    TORCH_CHECK_INDEX(it != end(), "FlatMap::at: no such key");
    return it->second;
  }
  const V& at(const K& key) const { return const_cast<FlatMap*>(this)->at(key); }

  /// Appends (key, value) if `key` sorts after every key in the map and returns true;
  /// otherwise returns false and moves from neither argument. One comparison.
  bool append(K&& key, V&& value) {
    if (size_ != 0 && !Less()(back().first, key)) return false;
    construct_back(std::move(key), std::move(value));
    return true;
  }

  /// Inserts (key, V(args...)) unless `key` is present; returns the entry and whether it was
  /// inserted, as std::map::try_emplace does. After the last key, an append.
  template <typename KK, typename... Args>
  std::pair<iterator, bool> try_emplace(KK&& key, Args&&... args) {
    if (size_ == 0 || Less()(back().first, key)) {
      construct_back(std::piecewise_construct, std::forward_as_tuple(std::forward<KK>(key)),
                     std::forward_as_tuple(std::forward<Args>(args)...));
      return {std::prev(end()), true};
    }
    const iterator at = lower_bound(key);
    if (!Less()(key, at->first)) return {at, false};
    value_type entry(std::piecewise_construct, std::forward_as_tuple(std::forward<KK>(key)),
                     std::forward_as_tuple(std::forward<Args>(args)...));
    const size_t i = at - begin();
    construct_back(std::move(back()));
    std::move_backward(begin() + i, end() - 2, end() - 1);
    begin()[i] = std::move(entry);
    return {begin() + i, true};
  }
  template <typename KK, typename VV>
  std::pair<iterator, bool> emplace(KK&& key, VV&& value) {
    return try_emplace(std::forward<KK>(key), std::forward<VV>(value));
  }
  /// std::map's emplace_hint: the hint is not needed (an append is found without it).
  template <typename KK, typename VV>
  iterator emplace_hint(const_iterator /*hint*/, KK&& key, VV&& value) {
    return try_emplace(std::forward<KK>(key), std::forward<VV>(value)).first;
  }
  template <typename VV>
  std::pair<iterator, bool> insert_or_assign(K key, VV&& value) {
    auto [it, inserted] = try_emplace(std::move(key), std::forward<VV>(value));
    if (!inserted) it->second = std::forward<VV>(value);
    return {it, inserted};
  }
  V& operator[](const K& key) { return try_emplace(key).first->second; }

  iterator erase(const_iterator it) {
    const size_t i = it.i_;
    std::move(begin() + i + 1, end(), begin() + i);
    destroy_from(size_ - 1);
    return begin() + i;
  }
  size_t erase(const K& key) {
    auto it = find(key);
    if (it == end()) return 0;
    erase(const_iterator(it));
    return 1;
  }

  /// The entries, in key order; the map is left empty.
  std::vector<value_type> release() && {
    std::vector<value_type> out;
    out.reserve(size_);
    for (auto& e : *this) out.push_back(std::move(e));
    free_all();
    return out;
  }

  bool operator==(const FlatMap& o) const {
    return size_ == o.size_ && std::equal(begin(), end(), o.begin());
  }
  bool operator!=(const FlatMap& o) const { return !(*this == o); }

 private:
  struct KeyLess {
    bool operator()(const value_type& e, const K& key) const { return Less()(e.first, key); }
  };

  size_t capacity() const { return blocks_.size() << kShift; }
  value_type& back() { return *std::prev(end()); }
  void add_block() {
    blocks_.push_back(static_cast<value_type*>(::operator new(
        kPerBlock * sizeof(value_type), std::align_val_t(alignof(value_type)))));
  }
  template <typename... Args>
  void construct_back(Args&&... args) {
    if (size_ == capacity()) add_block();
    new (&blocks_[size_ >> kShift][size_ & kMask]) value_type(std::forward<Args>(args)...);
    ++size_;
  }
  // Destroys the entries from index `from` on; keeps the blocks.
  void destroy_from(size_t from) {
    while (size_ > from) {
      --size_;
      blocks_[size_ >> kShift][size_ & kMask].~value_type();
    }
  }
  void free_all() {
    destroy_from(0);
    for (value_type* block : blocks_) {
      ::operator delete(block, std::align_val_t(alignof(value_type)));
    }
    blocks_.clear();
  }

  std::vector<value_type*> blocks_;
  size_t size_ = 0;
};

}  // namespace dcp
