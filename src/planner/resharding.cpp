// Resharding on load (Python's create_read_items_for_chunk_list, docs/format.md §6.5): for every
// destination chunk and every saved chunk that overlaps it in every dimension, one ReadItem
// with, per dimension,
//   start = max(dest.off, saved.off), end = min(dest.off + dest.size, saved.off + saved.size),
//   storage_offset = start - saved.off, dest_offset = start - dest.off, length = end - start.
// Zero-size extents never overlap; 0-d tensors always do (one read with empty vectors).
// Also: the global save-plan validation (bounds, overlap, coverage) and the nearest-key search.
#include <c10/util/Exception.h>

#include <algorithm>

#include "planner/planner_helpers.h"
#include "util/checked.h"

namespace dcp::detail {
namespace {

bool overlaps(const ChunkStorageMetadata& a, const ChunkStorageMetadata& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (!(a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<ReadItem> create_read_items_for_chunk_list(
    const std::string& fqn, const TensorStorageMetadata& saved,
    const std::vector<ChunkStorageMetadata>& local_chunks) {
  std::vector<ReadItem> reads;
  for (size_t i = 0; i < local_chunks.size(); ++i) {
    const auto& dest = local_chunks[i];
    for (size_t j = 0; j < saved.chunks.size(); ++j) {
      const auto& src = saved.chunks[j];
      if (!overlaps(dest, src)) continue;
      ReadItem r;
      r.type = LoadItemType::TENSOR;
      r.dest_index = MetadataIndex(fqn, dest.offsets, static_cast<int64_t>(i));
      r.storage_index = MetadataIndex(fqn, src.offsets, static_cast<int64_t>(j));
      for (size_t d = 0; d < dest.offsets.size(); ++d) {
        const int64_t start = std::max(dest.offsets[d], src.offsets[d]);
        const int64_t end =
            std::min(dest.offsets[d] + dest.sizes[d], src.offsets[d] + src.sizes[d]);
        r.storage_offsets.push_back(start - src.offsets[d]);
        r.dest_offsets.push_back(start - dest.offsets[d]);
        r.lengths.push_back(end - start);
      }
      reads.push_back(std::move(r));
    }
  }
  return reads;
}

// Bounds and volume per chunk (checked arithmetic: the chunks may come from a hostile
// '.metadata'); overlaps by a sweep along the dimension with the largest extent (chunks sorted
// by their start there; each is compared only with the chunks that start before it ends), so
// row-sharded tensors over many ranks cost O(n log n), as in newer PyTorch.
std::string validate_chunks(const std::string& fqn, const TensorStorageMetadata& t,
                            bool require_cover) {
  const auto tensor_volume = checked_volume(t.size);
  if (!tensor_volume) {
    return c10::str("'", fqn, "': shape ", c10::IntArrayRef(t.size),
                    " is negative or its volume overflows");
  }
  if (t.size.empty()) {  // 0-d: one chunk with no dimensions
    if (require_cover && t.chunks.empty()) return c10::str("'", fqn, "': no saved chunk");
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      if (!t.chunks[i].offsets.empty() || !t.chunks[i].sizes.empty()) {
        return c10::str("'", fqn, "': chunk ", i, " has the wrong number of dimensions");
      }
    }
    return "";
  }
  __int128 covered = 0;  // chunk volumes add up past int64 when chunks overlap
  std::vector<size_t> nonempty;
  nonempty.reserve(t.chunks.size());
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const auto& c = t.chunks[i];
    if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) {
      return c10::str("'", fqn, "': chunk ", i, " has the wrong number of dimensions");
    }
    const auto v = checked_volume(c.sizes);
    if (!v) {
      return c10::str("'", fqn, "': chunk ", i, " has sizes ", c10::IntArrayRef(c.sizes),
                      " (negative, or a volume that overflows)");
    }
    if (*v == 0) continue;
    for (size_t d = 0; d < t.size.size(); ++d) {
      const auto end = checked_add(c.offsets[d], c.sizes[d]);
      if (c.offsets[d] < 0 || !end || *end > t.size[d]) {
        return c10::str("'", fqn, "': chunk ", i, " at offsets ", c10::IntArrayRef(c.offsets),
                        " sizes ", c10::IntArrayRef(c.sizes), " leaves the tensor's shape ",
                        c10::IntArrayRef(t.size));
      }
    }
    covered += *v;
    nonempty.push_back(i);
  }
  const size_t dim = static_cast<size_t>(
      std::max_element(t.size.begin(), t.size.end()) - t.size.begin());
  auto by_offset = [&](size_t a, size_t b) {
    return t.chunks[a].offsets[dim] < t.chunks[b].offsets[dim];
  };
  // Chunks usually arrive in offset order (ranks in shard order): sorting is then skipped.
  if (!std::is_sorted(nonempty.begin(), nonempty.end(), by_offset)) {
    std::sort(nonempty.begin(), nonempty.end(), by_offset);
  }
  for (size_t x = 0; x < nonempty.size(); ++x) {
    const auto& a = t.chunks[nonempty[x]];
    for (size_t y = x + 1; y < nonempty.size(); ++y) {
      const auto& b = t.chunks[nonempty[y]];
      if (b.offsets[dim] >= a.offsets[dim] + a.sizes[dim]) break;
      if (overlaps(a, b)) {
        return c10::str("'", fqn, "': chunks ", std::min(nonempty[x], nonempty[y]), " and ",
                        std::max(nonempty[x], nonempty[y]), " overlap");
      }
    }
  }
  if (require_cover && covered != *tensor_volume) {
    return c10::str("'", fqn, "': chunks cover ", static_cast<int64_t>(std::min<__int128>(covered, INT64_MAX)),
                    " of ", *tensor_volume, " elements");
  }
  return "";
}

std::string validate_global_plan(const Metadata& metadata, size_t num_plans) {
  for (const auto& [fqn, entry] : metadata.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    if (t == nullptr || t->size.empty()) continue;
    std::string problem = validate_chunks(fqn, *t, num_plans > 1);
    if (!problem.empty()) return problem;
  }
  return "";
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool ends_with_component(const std::string& longer, const std::string& shorter) {
  return longer.size() > shorter.size() &&
         longer.compare(longer.size() - shorter.size(), shorter.size(), shorter) == 0 &&
         longer[longer.size() - shorter.size() - 1] == '.';
}

}  // namespace

std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates) {
  // A prefix added or dropped ("module.", "model.") is the most common rename.
  for (const auto& c : candidates) {
    if (ends_with_component(c, key) || ends_with_component(key, c)) return c;
  }
  std::string best;
  size_t best_distance = std::max<size_t>(3, key.size() / 2) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace dcp::detail
