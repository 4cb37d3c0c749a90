// Metadata helpers: printing, equality and storage_data assembly.
#include "dcp/metadata.h"

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "storage_data.h"
#include "util/look_ahead.h"
#include "util/name_interner.h"
#include "util/offset_order.h"

namespace dcp {

std::ostream& operator<<(std::ostream& os, const MetadataIndex& index) {
  os << "MetadataIndex(fqn='" << index.fqn << "'";
  if (index.offset) {
    os << ", offset=[";
    for (size_t i = 0; i < index.offset->size(); ++i) os << (i ? ", " : "") << (*index.offset)[i];
    os << "]";
  }
  if (index.index) os << ", index=" << *index.index;
  return os << ")";
}

bool Metadata::operator==(const Metadata& o) const {
  if (!(state_dict_metadata == o.state_dict_metadata) || !(planner_data == o.planner_data) ||
      !(storage_meta == o.storage_meta) || !(version == o.version) ||
      storage_data.size() != o.storage_data.size()) {
    return false;
  }
  auto a = storage_data.begin();
  for (auto b = o.storage_data.begin(); b != o.storage_data.end(); ++a, ++b) {
    if (a->first != b->first || a->first.index != b->first.index || !(a->second == b->second)) {
      return false;
    }
  }
  return true;
}

// The builders' vectors of entries grow by moving them; were a move able to throw, std::vector
// would copy every string and Dims instead.
static_assert(std::is_nothrow_move_constructible_v<StorageData::value_type>);

namespace detail {

StorageData make_storage_data(
    std::vector<std::pair<MetadataIndex, StorageInfo>> entries) {
  // Intern the names (a checkpoint has far fewer tensors than chunks) and rank them in string
  // order, so the sort below compares integers.
  NameInterner interner;
  std::vector<uint32_t> name_id(entries.size());
  std::vector<OffsetHead> head(entries.size());
  LookAhead ahead(entries.begin(), entries.end());  // Note [Look-ahead]
  for (size_t i = 0; i < entries.size(); ++i) {
    ahead.step([](const auto& next) {
      touch(next.first.fqn);
      touch(next.first.offset);
    });
    name_id[i] = interner.intern(entries[i].first.fqn).first;
    head[i] = OffsetHead::of(entries[i].first.offset);
  }
  const auto& names = interner.names();
  std::vector<uint32_t> by_name(names.size());
  std::iota(by_name.begin(), by_name.end(), 0);
  std::sort(by_name.begin(), by_name.end(),
            [&](uint32_t a, uint32_t b) { return names[a] < names[b]; });
  std::vector<uint32_t> name_rank(names.size());
  for (uint32_t r = 0; r < by_name.size(); ++r) name_rank[by_name[r]] = r;

  // Bucket by name rank (a stable counting sort), then sort each bucket by offset; ties keep
  // input order. Buckets usually arrive sorted already (ranks in shard order): checked first.
  std::vector<size_t> start(names.size() + 1, 0);
  for (size_t i = 0; i < entries.size(); ++i) ++start[name_rank[name_id[i]] + 1];
  for (size_t r = 0; r < names.size(); ++r) start[r + 1] += start[r];
  std::vector<size_t> order(entries.size());
  {
    std::vector<size_t> next(start.begin(), start.end() - 1);
    for (size_t i = 0; i < entries.size(); ++i) order[next[name_rank[name_id[i]]]++] = i;
  }
  auto compare = [&](size_t a, size_t b) {
    return compare_offsets(head[a], entries[a].first.offset, head[b], entries[b].first.offset);
  };
  auto offset_less = [&](size_t a, size_t b) {
    const int c = compare(a, b);
    return c != 0 ? c < 0 : a < b;
  };
  for (size_t r = 0; r < names.size(); ++r) {
    const auto begin = order.begin() + start[r], end = order.begin() + start[r + 1];
    if (!std::is_sorted(begin, end, offset_less)) std::sort(begin, end, offset_less);
  }

  StorageData out;
  out.reserve(order.size());
  LookAhead ahead_in_order(order.begin(), order.end());  // Note [Look-ahead]
  for (size_t k = 0; k < order.size(); ++k) {
    ahead_in_order.step([&](size_t next) { touch(&entries[next]); });
    // Equal keys sit together in input order; the last of them wins.
    if (k + 1 < order.size() && name_id[order[k]] == name_id[order[k + 1]] &&
        compare(order[k], order[k + 1]) == 0) {
      continue;
    }
    auto& [index, info] = entries[order[k]];
    const bool appended = out.append(std::move(index), std::move(info));
    TORCH_INTERNAL_ASSERT(appended, "make_storage_data: the sort left ", index, " out of order");
  }
  return out;
}

void StorageDataBuilder::add(MetadataIndex index, StorageInfo info) {
  if (unordered_.empty()) {
    if (ordered_.append(std::move(index), std::move(info))) return;
    unordered_ = std::move(ordered_).release();
    unordered_.reserve(2 * unordered_.size() + 1);
  }
  unordered_.emplace_back(std::move(index), std::move(info));
}

StorageData StorageDataBuilder::finish() && {
  return unordered_.empty() ? std::move(ordered_) : make_storage_data(std::move(unordered_));
}

}  // namespace detail

}  // namespace dcp
