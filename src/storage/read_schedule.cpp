// schedule_reads (see read_schedule.h):
//   1. group the plan's reads by the saved item they read (its storage_index), so each record
//      is read once;
//   2. order the groups by file and offset: each file is read front to back, which the
//      kernel's read-ahead rewards (key order would jump around files laid out by size);
//   3. with a prefetch window: the byte ranges each group will touch (Note [Record geometry]
//      in format/torch_save.h), and for each group how far the announcements must have run
//      before it is read.
//
// Note [Prefetch]: reads are synchronous, one record after another, so by themselves they keep
// one request per IO thread at the disk, plus what the kernel's read-ahead guesses. Before
// reading a record, the reader therefore announces the byte ranges of the records that follow,
// up to ReadOptions::prefetch_bytes ahead (InputFile::prefetch: posix_fadvise WILLNEED on
// disk), and the disk works on them while this record is copied. On the development VM, cold
// 4-rank loads of a 2 GiB checkpoint took 0.98-1.32 s with a 32 MiB window and 2.24-3.05 s
// without (docs/performance.md). The ranges come from the metadata alone, before the record's
// header is read: a resharding load announces only a few KiB per record beyond what it reads.
// They are hints: reads never depend on them.
#include "storage/read_schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>

#include "util/checked.h"

namespace dcp::detail {
namespace {

std::string box_string(c10::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The saved chunk a storage index names, from the metadata (nullptr if it is not there).
const ChunkStorageMetadata* saved_chunk(const Metadata& metadata, const MetadataIndex& index,
                                        c10::ScalarType* dtype) {
  auto it = metadata.state_dict_metadata.find(index.fqn);
  if (it == metadata.state_dict_metadata.end() || !index.offset) return nullptr;
  const auto* tensor = std::get_if<TensorStorageMetadata>(&it->second);
  if (tensor == nullptr) return nullptr;
  *dtype = tensor->properties.dtype;
  const auto& chunks = tensor->chunks;
  const int64_t hint = index.index.value_or(-1);
  if (hint >= 0 && hint < static_cast<int64_t>(chunks.size()) &&
      chunks[hint].offsets == *index.offset) {
    return &chunks[hint];
  }
  for (const auto& chunk : chunks) {
    if (chunk.offsets == *index.offset) return &chunk;
  }
  return nullptr;
}

}  // namespace

uint64_t decoded_size_bound(c10::ScalarType dtype, const ChunkStorageMetadata* chunk,
                            const std::string& fqn) {
  if (chunk == nullptr) return kMaxDecodedValueBytes;
  const std::optional<int64_t> numel = checked_volume(chunk->sizes);
  const std::optional<int64_t> bytes =
      numel ? checked_mul(*numel, static_cast<int64_t>(c10::elementSize(dtype))) : std::nullopt;
  const std::optional<int64_t> bound =
      bytes ? checked_add(*bytes, static_cast<int64_t>(kRecordOverheadBound)) : std::nullopt;
  TORCH_CHECK(bound.has_value(), "the saved chunk of '", fqn,
              "' has sizes whose byte count overflows");
  return static_cast<uint64_t>(*bound);
}

uint64_t decoded_size_bound(const Metadata& metadata, const ReadItem& item) {
  c10::ScalarType dtype = c10::ScalarType::Byte;
  const ChunkStorageMetadata* chunk = item.type == LoadItemType::BYTE_IO
                                          ? nullptr
                                          : saved_chunk(metadata, item.storage_index, &dtype);
  return decoded_size_bound(dtype, chunk, item.storage_index.fqn);
}

namespace {

// The byte ranges of the file that reading one record will touch, sorted and disjoint.
std::vector<ByteRange> record_ranges(const RecordRead& record, const Metadata& metadata,
                                     const ReadOptions& options) {
  const StorageInfo& info = *record.info;
  const uint64_t o = static_cast<uint64_t>(info.offset);
  const uint64_t l = static_cast<uint64_t>(info.length);
  const std::vector<ByteRange> whole{{o, o + l}};
  if (!options.ranged_reads || record.items.front()->type == LoadItemType::BYTE_IO ||
      !info.transform_descriptors.empty() || l <= options.whole_record_bytes) {
    // Read whole: compressed items (Note [Compressed items], read_items.cpp) and small records
    // (Note [Small records], read_schedule.h).
    return whole;
  }
  c10::ScalarType dtype;
  const ChunkStorageMetadata* chunk =
      saved_chunk(metadata, record.items.front()->storage_index, &dtype);
  if (chunk == nullptr) return whole;
  const size_t dims = chunk->sizes.size();
  const uint64_t itemsize = c10::elementSize(dtype);
  Dims strides(dims, 1);  // row-major, in elements
  int64_t numel = 1;
  for (size_t d = dims; d-- > 0;) {
    strides[d] = numel;
    numel *= std::max<int64_t>(chunk->sizes[d], 0);
  }
  const auto geometry = RecordGeometry::of(l, static_cast<uint64_t>(numel) * itemsize);
  if (!geometry) return whole;
  std::vector<ByteRange> ranges{geometry->head(), geometry->tail()};
  for (const ReadItem* item : record.items) {
    if (item->storage_offsets.size() != dims || item->lengths.size() != dims) return whole;
    const auto extent = box_extent(item->storage_offsets, item->lengths, strides);
    if (!extent) continue;
    ranges.push_back(geometry->data(static_cast<uint64_t>(extent->first) * itemsize,
                                    (static_cast<uint64_t>(extent->second) + 1) * itemsize));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (r.end <= r.begin) continue;
    if (!merged.empty() && o + r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, o + r.end);
    } else {
      merged.push_back({o + r.begin, o + r.end});
    }
  }
  return merged;
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> box_extent(c10::IntArrayRef offsets,
                                                      c10::IntArrayRef lengths,
                                                      c10::IntArrayRef strides) {
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < strides.size(); ++d) {
    if (lengths[d] <= 0) return std::nullopt;
    first += offsets[d] * strides[d];
    last += (offsets[d] + lengths[d] - 1) * strides[d];
  }
  return std::make_pair(first, last);
}

std::vector<RecordRead> schedule_reads(const LoadPlan& plan, const Metadata& metadata,
                                       const ReadOptions& options) {
  std::map<MetadataIndex, std::vector<const ReadItem*>> groups;
  for (const auto& item : plan.items) groups[item.storage_index].push_back(&item);
  std::vector<RecordRead> records;
  records.reserve(groups.size());
  for (auto& [index, items] : groups) {
    auto info = metadata.storage_data.find(index);
    TORCH_CHECK(info != metadata.storage_data.end(),
                "the checkpoint metadata has no storage entry for '", index.fqn, "'",
                index.offset ? " chunk at " + box_string(*index.offset) : std::string());
    const StorageInfo& where = info->second;
    TORCH_CHECK(where.offset >= 0 && where.length >= 0 &&
                    where.length <= std::numeric_limits<int64_t>::max() - where.offset,
                "the checkpoint metadata places '", index.fqn, "'",
                index.offset ? " chunk at " + box_string(*index.offset) : std::string(),
                " at offset ", where.offset, " length ", where.length, " in '",
                where.relative_path, "'");
    RecordRead record;
    record.info = &where;
    record.items = std::move(items);
    records.push_back(std::move(record));
  }
  std::sort(records.begin(), records.end(), [](const RecordRead& a, const RecordRead& b) {
    const int c = a.info->relative_path.compare(b.info->relative_path);
    return c != 0 ? c < 0 : a.info->offset < b.info->offset;
  });
  // Two entries sharing bytes would hand one record to two items.
  for (size_t k = 1; k < records.size(); ++k) {
    const StorageInfo& a = *records[k - 1].info;
    const StorageInfo& b = *records[k].info;
    TORCH_CHECK(a.relative_path != b.relative_path || a.offset + a.length <= b.offset,
                "the checkpoint metadata places '", records[k - 1].items.front()->storage_index.fqn,
                "' at [", a.offset, ", ", a.offset + a.length, ") and '",
                records[k].items.front()->storage_index.fqn, "' at [", b.offset, ", ",
                b.offset + b.length, ") of '", a.relative_path, "': the ranges overlap");
  }
  if (options.prefetch_bytes == 0) return records;

  // ahead[w]: announced bytes before record w. Record w may be read once every record j with
  // j <= w or ahead[j] - ahead[w] < prefetch_bytes has been announced.
  std::vector<uint64_t> ahead{0};
  ahead.reserve(records.size() + 1);
  for (RecordRead& record : records) {
    record.ranges = record_ranges(record, metadata, options);
    uint64_t bytes = 0;
    for (const ByteRange& r : record.ranges) bytes += r.size();
    ahead.push_back(ahead.back() + bytes);
  }
  size_t end = 0;
  for (size_t w = 0; w < records.size(); ++w) {
    end = std::max(end, w + 1);
    while (end < records.size() && ahead[end] - ahead[w] < options.prefetch_bytes) ++end;
    records[w].announce_end = end;
  }
  return records;
}

}  // namespace dcp::detail
