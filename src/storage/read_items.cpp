// read_items (see read_items.h): executes the read schedule (read_schedule.h).
//
// Each IO thread takes the next record in schedule order; before reading it, makes sure the
// records up to its announce_end have been announced to their files (Note [Prefetch]); reads
// the record's header once; byte items go to planner.load_bytes, tensor boxes are read (Note
// [Ranged reads]) into planner.resolve_tensor's destination, then commit_tensor.
#include "storage/read_items.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <map>
#include <mutex>
#include <utility>

#include "format/stream_transform.h"
#include "format/torch_save.h"
#include "storage/paths.h"
#include "util/crc32.h"
#include "util/error_context.h"
#include "util/parallel.h"

namespace dcp::detail {
namespace {

at::Tensor narrow_box(at::Tensor t, c10::IntArrayRef offsets, c10::IntArrayRef lengths) {
  for (size_t d = 0; d < offsets.size(); ++d) {
    if (offsets[d] != 0 || lengths[d] != t.size(static_cast<int64_t>(d))) {
      t = t.narrow(static_cast<int64_t>(d), offsets[d], lengths[d]);
    }
  }
  return t;
}

bool is_row_major(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// Note [Ranged reads]: only the bytes between the box's first and last element are read, and
// when they are exactly the box in row-major order and the destination is a contiguous tensor
// of the same dtype, they are read straight into the destination's memory. A row-sharded
// reshard thus reads what it needs and nothing else, with no intermediate copy.
// Note [CRC on load]: torch.save records carry a CRC-32 per zip entry, in files written by
// Python and by dcp. data.pkl is checked by the zip reader when it extracts it; tensor data,
// which dcp reads straight from its offset, is checked here whenever a read covers a whole
// storage (every same-layout load, the simple path, tensors inside byte items). A resharding
// read of part of a chunk cannot be checked without reading the rest; dcp::verify reads all.
void read_box(const ArchiveSource& source, const TensorRecord& record, const ReadItem& item,
              at::Tensor& dest, bool verify_crc32) {
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(record.dtype));
  const auto extent = box_extent(item.storage_offsets, item.lengths, record.strides);
  if (!extent) return;  // nothing to copy
  const int64_t first = record.storage_offset + extent->first;
  const int64_t count = extent->second - extent->first + 1;
  const int64_t numel = c10::multiply_integers(item.lengths);
  const uint64_t begin = record.data_offset + static_cast<uint64_t>(first * itemsize);
  const uint64_t nbytes = static_cast<uint64_t>(count * itemsize);
  const bool whole_storage = verify_crc32 && record.storage_crc32 &&
                             begin == record.data_offset && nbytes == record.storage_bytes;
  if (count == numel && is_row_major(record.sizes, record.strides) && dest.is_contiguous() &&
      dest.scalar_type() == record.dtype && dest.device().is_cpu()) {
    source.read(begin, dest.data_ptr(), nbytes);
    if (whole_storage) check_storage_crc32(source, record, crc32(dest.data_ptr(), nbytes));
    return;
  }
  at::Tensor span = at::empty({count}, at::TensorOptions().dtype(record.dtype));
  source.read(begin, span.data_ptr(), nbytes);
  if (whole_storage) check_storage_crc32(source, record, crc32(span.data_ptr(), nbytes));
  dest.copy_(span.as_strided(item.lengths, record.strides, 0));
}

// Reads one record for all of its reads: byte items to load_bytes, tensor boxes into
// resolve_tensor's destinations.
void read_record(const ArchiveSource& source, const std::vector<const ReadItem*>& items,
                 LoadPlanner& planner, const ReadOptions& options) {
  if (items.front()->type == LoadItemType::BYTE_IO) {
    Value value = read_value_archive(source, options.verify_crc32);
    for (const ReadItem* item : items) planner.load_bytes(*item, value);
    return;
  }
  if (!options.ranged_reads) {  // the simple path: the whole saved chunk, then copies
    const at::Tensor saved = read_tensor_archive(source, options.verify_crc32);
    for (const ReadItem* item : items) {
      at::Tensor src = narrow_box(saved, item->storage_offsets, item->lengths);
      at::Tensor dest = planner.resolve_tensor(*item);
      TORCH_CHECK(dest.sizes() == src.sizes(), "destination box ", dest.sizes(),
                  " does not match the saved box ", src.sizes());
      dest.copy_(src);
      planner.commit_tensor(*item, dest);
    }
    return;
  }
  const TensorRecord record = read_tensor_record(source);
  for (const ReadItem* item : items) {
    at::Tensor dest = planner.resolve_tensor(*item);
    TORCH_CHECK(dest.sizes() == c10::IntArrayRef(item->lengths), "destination box ",
                dest.sizes(), " does not match the saved box ",
                c10::IntArrayRef(item->lengths));
    TORCH_CHECK(item->storage_offsets.size() == record.sizes.size(), "the saved record has ",
                record.sizes.size(), " dimensions, the read ", item->storage_offsets.size());
    for (size_t d = 0; d < record.sizes.size(); ++d) {
      TORCH_CHECK(item->storage_offsets[d] + item->lengths[d] <= record.sizes[d],
                  "the read box leaves the saved chunk of shape ",
                  c10::IntArrayRef(record.sizes));
    }
    read_box(source, record, *item, dest, options.verify_crc32);
    planner.commit_tensor(*item, dest);
  }
}

}  // namespace

ItemSource::ItemSource(std::shared_ptr<const InputFile> file, const StorageInfo& info)
    : file_(std::move(file)), info_(info) {
  const uint64_t end = static_cast<uint64_t>(info.offset) + static_cast<uint64_t>(info.length);
  TORCH_CHECK(end <= file_->size(), "item ", describe(), " lies past the end of '",
              file_->name(), "', which has ", file_->size(), " bytes (truncated file?)");
}

void ItemSource::read(uint64_t offset, void* dst, size_t n) const {
  TORCH_CHECK(offset <= size() && n <= size() - offset, "reading ", describe(), " at [", offset,
              ", ", offset + n, "): past the item's end");
  file_->read(static_cast<uint64_t>(info_.offset) + offset, dst, n);
}

std::string ItemSource::describe() const {
  return "'" + paths::printable(info_.relative_path) + "' [" + std::to_string(info_.offset) +
         ", " + std::to_string(info_.offset + info_.length) + ")";
}

void read_items(const LoadPlan& plan, LoadPlanner& planner, const Metadata& metadata,
                const FileOpener& open, const ReadOptions& options) {
  const std::vector<RecordRead> schedule = schedule_reads(plan, metadata, options);

  std::mutex files_mu;
  std::map<std::string, std::shared_ptr<const InputFile>> files;  // guarded by files_mu
  auto file = [&](const std::string& relative) {
    std::lock_guard<std::mutex> lock(files_mu);
    auto it = files.find(relative);
    if (it == files.end()) it = files.emplace(relative, open(relative)).first;
    return it->second;
  };

  std::mutex announce_mu;
  size_t announced = 0;  // records [0, announced) have been announced; guarded by announce_mu
  // Ranges are merged across records while the gap to the next is within prefetch_merge_gap,
  // up to kPrefetchMergeMax bytes. The merged range is held back until the next range does not
  // join it, it is full, the announcements reach the schedule's end, or the record about to be
  // read lies in it.
  std::shared_ptr<const InputFile> pending_file;  // guarded by announce_mu
  const std::string* pending_path = nullptr;      // guarded by announce_mu
  ByteRange pending{0, 0};                        // guarded by announce_mu
  auto flush = [&] {
    if (pending_file && pending.size() > 0) pending_file->prefetch(pending.begin, pending.size());
    pending_file.reset();
  };
  auto announce_through = [&](const RecordRead& reading) {
    std::lock_guard<std::mutex> lock(announce_mu);
    for (; announced < reading.announce_end; ++announced) {
      const RecordRead& next = schedule[announced];
      std::shared_ptr<const InputFile> f;
      try {
        f = file(next.info->relative_path);
      } catch (const c10::Error&) {
        continue;  // only a hint: reading that record will report the error, with its context
      }
      for (const ByteRange& r : next.ranges) {
        if (pending_file == f && r.begin >= pending.begin &&
            r.begin <= pending.end + options.prefetch_merge_gap &&
            std::max(pending.end, r.end) - pending.begin <= kPrefetchMergeMax) {
          pending.end = std::max(pending.end, r.end);
          continue;
        }
        flush();
        pending_file = f;
        pending_path = &next.info->relative_path;
        pending = r;
      }
    }
    if (!pending_file) return;
    const uint64_t reading_end =
        static_cast<uint64_t>(reading.info->offset) + static_cast<uint64_t>(reading.info->length);
    if (announced == schedule.size() ||
        (*pending_path == reading.info->relative_path && pending.begin < reading_end)) {
      flush();
    }
  };

  run_parallel(schedule.size(), options.thread_count, [&](size_t w) {
    const RecordRead& record = schedule[w];
    announce_through(record);
    const MetadataIndex& index = record.items.front()->storage_index;
    const StorageInfo& info = *record.info;
    with_context(
        [&] {
          const ItemSource source(file(info.relative_path), info);
          std::optional<BufferSource> decoded;
          if (is_zstd_item(info.transform_descriptors)) {
            const uint64_t bound = decoded_size_bound(metadata, *record.items.front());
            read_record(decoded_record(source, info, bound, decoded), record.items, planner,
                        options);
          } else if (source.size() <= options.whole_record_bytes) {  // Note [Small records]
            std::string bytes(source.size(), '\0');
            source.read(0, bytes.data(), bytes.size());
            decoded.emplace(std::move(bytes), source);
            read_record(*decoded, record.items, planner, options);
          } else {
            read_record(source, record.items, planner, options);
          }
        },
        [&] {
          return c10::str("reading '", index.fqn, "' from '",
                          paths::printable(info.relative_path), "' [",
                          info.offset, ", ", info.offset + info.length, ")");
        });
  });
}

// Note [Compressed items]: a zstd stream has no index, so the whole item is read and
// decompressed (bounded by what its metadata allows), then read from memory.
const ArchiveSource& decoded_record(const ItemSource& item, const StorageInfo& info,
                                    uint64_t max_decoded_bytes,
                                    std::optional<BufferSource>& decoded) {
  if (!is_zstd_item(info.transform_descriptors)) return item;
  decoded.emplace(zstd_decompress(item, max_decoded_bytes),
                  item.describe() + " (zstd-decompressed)");
  return *decoded;
}

std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner,
                            const Metadata* metadata, const FileOpener& open,
                            const ReadOptions& options) {
  std::promise<void> promise;
  try {
    TORCH_CHECK(metadata != nullptr, "read_data before set_up_storage_reader");
    read_items(plan, planner, *metadata, open, options);
    promise.set_value();
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  return promise.get_future();
}

}  // namespace dcp::detail
