// Shared item IO for file-like backends (see item_io.h).
//
// Writing one bucket:
//   for each item (byte items first, then tensors): resolve its payload through the planner,
//   append a torch.save record at the stream's position, record (file, offset, length).
// Reading a plan:
//   group read items by the saved item they read (storage_index); visit the groups in file
//   and offset order (each file front to back), announcing the byte ranges of the groups
//   ahead to the files (Note [Prefetch]); for each group read the record once; byte items go
//   to planner.load_bytes, tensor boxes are narrowed and copied into planner.resolve_tensor's
//   destination, then commit_tensor.
#include "storage/item_io.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "format/torch_save.h"
#include "storage/paths.h"

namespace dcp::detail {

std::vector<FileBucket> assign_files(const SavePlan& plan, bool single_file_per_rank,
                                     int thread_count) {
  std::vector<FileBucket> buckets;
  if (!single_file_per_rank) {
    for (size_t i = 0; i < plan.items.size(); ++i) {
      buckets.push_back(FileBucket{paths::data_file(plan.storage_data, static_cast<int>(i)),
                                   {&plan.items[i]}});
    }
    return buckets;
  }
  const int n = std::max(1, thread_count);
  buckets.resize(n);
  for (int k = 0; k < n; ++k) buckets[k].relative_path = paths::data_file(plan.storage_data, k);
  std::vector<const WriteItem*> tensors;
  size_t next = 0;
  for (const auto& item : plan.items) {
    if (item.type == WriteItemType::BYTE_IO) buckets[next++ % n].items.push_back(&item);
    else tensors.push_back(&item);
  }
  // Python sorts by the *global* tensor size; so do we, for an identical layout.
  auto global_bytes = [](const WriteItem* item) {
    int64_t numel = 1;
    for (int64_t d : item->tensor_data->size) numel *= d;
    return numel * static_cast<int64_t>(c10::elementSize(item->tensor_data->properties.dtype));
  };
  std::stable_sort(tensors.begin(), tensors.end(), [&](const WriteItem* a, const WriteItem* b) {
    return global_bytes(a) > global_bytes(b);
  });
  std::vector<int64_t> totals(n, 0);
  for (const WriteItem* item : tensors) {
    const auto lightest = std::min_element(totals.begin(), totals.end()) - totals.begin();
    buckets[lightest].items.push_back(item);
    totals[lightest] += global_bytes(item);
  }
  return buckets;
}

std::vector<WriteResult> write_bucket(const FileBucket& bucket, SavePlanner& planner,
                                      OutputStream& out, int rank) {
  std::vector<WriteResult> results;
  results.reserve(bucket.items.size());
  const ByteSink sink = [&out](const void* data, size_t n) { out.write(data, n); };
  for (const WriteItem* item : bucket.items) {
    const uint64_t start = out.position();
    uint64_t length = 0;
    try {
      WritePayload payload = planner.resolve_data(*item);
      if (auto* tensor = std::get_if<at::Tensor>(&payload)) {
        TORCH_CHECK(item->type != WriteItemType::BYTE_IO, "planner resolved a byte item to a tensor");
        length = write_tensor_archive(tensor->detach().cpu(), sink);
      } else {
        length = write_value_archive(std::get<Value>(payload), sink);
      }
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "rank ", rank, ": writing '", item->index.fqn, "' to '",
                  bucket.relative_path, "' at byte ", start, ": ", e.what_without_backtrace());
    }
    WriteResult r;
    r.index = item->index;
    r.size_in_bytes = static_cast<int64_t>(length);
    r.storage_data = StorageInfo{bucket.relative_path, static_cast<int64_t>(start),
                                 static_cast<int64_t>(length), {}};
    results.push_back(std::move(r));
  }
  return results;
}

void run_parallel(size_t n, int threads, const std::function<void(size_t)>& task) {
  const size_t workers = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::mutex mu;
  size_t next = 0;
  std::exception_ptr first_error;
  auto worker = [&] {
    while (true) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= n || first_error) return;
        i = next++;
      }
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

std::future<std::vector<WriteResult>> write_files(
    const SavePlan& plan, bool single_file_per_rank, int thread_count,
    const std::function<std::vector<WriteResult>(const FileBucket&)>& write_file) {
  std::promise<std::vector<WriteResult>> promise;
  try {
    const auto buckets = assign_files(plan, single_file_per_rank, thread_count);
    std::vector<std::vector<WriteResult>> per_bucket(buckets.size());
    run_parallel(buckets.size(), thread_count,
                 [&](size_t b) { per_bucket[b] = write_file(buckets[b]); });
    std::vector<WriteResult> results;
    for (auto& r : per_bucket) {
      for (auto& item : r) results.push_back(std::move(item));
    }
    promise.set_value(std::move(results));
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  return promise.get_future();
}

namespace {

// One saved item inside a data file.
class ItemSource : public ArchiveSource {
 public:
  ItemSource(std::shared_ptr<const InputFile> file, const StorageInfo& info)
      : file_(std::move(file)), info_(info) {
    const uint64_t end = static_cast<uint64_t>(info.offset) + static_cast<uint64_t>(info.length);
    TORCH_CHECK(end <= file_->size(), "item ", describe(), " lies past the end of '",
                file_->name(), "', which has ", file_->size(), " bytes (truncated file?)");
  }
  uint64_t size() const override { return static_cast<uint64_t>(info_.length); }
  void read(uint64_t offset, void* dst, size_t n) const override {
    TORCH_CHECK(offset <= size() && n <= size() - offset, "reading ", describe(), " at [",
                offset, ", ", offset + n, "): past the item's end");
    file_->read(static_cast<uint64_t>(info_.offset) + offset, dst, n);
  }
  std::string describe() const override {
    return "'" + info_.relative_path + "' [" + std::to_string(info_.offset) + ", " +
           std::to_string(info_.offset + info_.length) + ")";
  }

 private:
  std::shared_ptr<const InputFile> file_;
  StorageInfo info_;
};

std::string box_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

at::Tensor narrow_box(at::Tensor t, const std::vector<int64_t>& offsets,
                      const std::vector<int64_t>& lengths) {
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

// The first and last element, counted in `strides`, that the box at `offsets` with `lengths`
// touches: [first, last]; nullopt when the box is empty.
std::optional<std::pair<int64_t, int64_t>> box_extent(const std::vector<int64_t>& offsets,
                                                      const std::vector<int64_t>& lengths,
                                                      c10::IntArrayRef strides) {
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < strides.size(); ++d) {
    if (lengths[d] <= 0) return std::nullopt;
    first += offsets[d] * strides[d];
    last += (offsets[d] + lengths[d] - 1) * strides[d];
  }
  return std::make_pair(first, last);
}

// Note [Ranged reads]: only the bytes between the box's first and last element are read, and
// when they are exactly the box in row-major order and the destination is a contiguous tensor
// of the same dtype, they are read straight into the destination's memory. A row-sharded
// reshard thus reads what it needs and nothing else, with no intermediate copy.
void read_box(const ArchiveSource& source, const TensorRecord& record, const ReadItem& item,
              at::Tensor& dest) {
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(record.dtype));
  const auto extent = box_extent(item.storage_offsets, item.lengths, record.strides);
  if (!extent) return;  // nothing to copy
  const int64_t first = record.storage_offset + extent->first;
  const int64_t count = extent->second - extent->first + 1;
  const int64_t numel = c10::multiply_integers(item.lengths);
  const uint64_t begin = record.data_offset + static_cast<uint64_t>(first * itemsize);
  const uint64_t nbytes = static_cast<uint64_t>(count * itemsize);
  if (count == numel && is_row_major(record.sizes, record.strides) && dest.is_contiguous() &&
      dest.scalar_type() == record.dtype && dest.device().is_cpu()) {
    source.read(begin, dest.data_ptr(), nbytes);
    return;
  }
  at::Tensor span = at::empty({count}, at::TensorOptions().dtype(record.dtype));
  source.read(begin, span.data_ptr(), nbytes);
  dest.copy_(span.as_strided(item.lengths, record.strides, 0));
}

// Note [Prefetch]: reads are synchronous, one record after another, so by themselves they keep
// one request per IO thread at the disk, plus what the kernel's read-ahead guesses. Before
// reading a record, the reader therefore announces the byte ranges of the records that follow,
// up to ReadOptions::prefetch_bytes ahead (InputFile::prefetch: posix_fadvise WILLNEED on
// disk), and the disk works on them while this record is copied. On the development VM, cold
// 4-rank loads of a 2 GiB checkpoint took 0.98-1.32 s with a 32 MiB window and 2.24-3.05 s
// without (docs/performance.md).
//
// The ranges are the ones the reads will touch, found before the record's header is read.
// A record [O, O + L) holding a saved chunk of `nbytes` has `slack = L - nbytes` bytes of zip
// headers, data.pkl and trailer, so its data starts somewhere in [O, O + slack]: data byte k
// lies in [O + k, O + slack + k], every header byte in [O, O + slack) and every trailer byte in
// [O + L - slack, O + L). A read of data bytes [a, b) therefore lies within
// [O + a, O + slack + b). The zip reader (miniz, under PyTorchStreamReader) looks for the end
// of the central directory by reading the record's last 4 KiB (kZipTailRead) in one go, so the
// trailer's range grows to that. Announcing those three ranges covers the record's reads and,
// for a resharding load, a few KiB more than what it needs. The bounds assume what dcp and
// Python DCP write (a contiguous chunk at storage offset 0); for anything else the hint is
// merely less useful, never wrong: the reads themselves do not depend on it.
struct Span {
  uint64_t begin, end;
};
constexpr uint64_t kZipTailRead = 4096;

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

// The byte ranges of the file that reading one group will touch (Note [Prefetch]), in order
// and disjoint.
std::vector<Span> group_spans(const std::vector<const ReadItem*>& items, const StorageInfo& info,
                              const Metadata& metadata, bool ranged_reads) {
  const uint64_t o = static_cast<uint64_t>(info.offset);
  const uint64_t l = static_cast<uint64_t>(info.length);
  const std::vector<Span> whole{{o, o + l}};
  if (!ranged_reads || items.front()->type == LoadItemType::BYTE_IO) return whole;
  c10::ScalarType dtype;
  const ChunkStorageMetadata* chunk = saved_chunk(metadata, items.front()->storage_index, &dtype);
  if (chunk == nullptr) return whole;
  const size_t dims = chunk->sizes.size();
  const uint64_t itemsize = c10::elementSize(dtype);
  std::vector<int64_t> strides(dims, 1);  // row-major, in elements
  int64_t numel = 1;
  for (size_t d = dims; d-- > 0;) {
    strides[d] = numel;
    numel *= std::max<int64_t>(chunk->sizes[d], 0);
  }
  if (static_cast<uint64_t>(numel) * itemsize > l) return whole;
  const uint64_t slack = l - static_cast<uint64_t>(numel) * itemsize;
  const uint64_t tail = std::max(slack, std::min(l, kZipTailRead));
  std::vector<Span> spans{{o, o + slack}, {o + l - tail, o + l}};
  for (const ReadItem* item : items) {
    if (item->storage_offsets.size() != dims || item->lengths.size() != dims) return whole;
    const auto extent = box_extent(item->storage_offsets, item->lengths, strides);
    if (!extent) continue;
    const uint64_t first = static_cast<uint64_t>(extent->first);
    const uint64_t end = static_cast<uint64_t>(extent->second) + 1;
    spans.push_back({o + first * itemsize, std::min(o + l, o + slack + end * itemsize)});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin < b.begin;
  });
  std::vector<Span> merged;
  for (const Span& s : spans) {
    if (s.end <= s.begin) continue;
    if (!merged.empty() && s.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, s.end);
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

}  // namespace

void read_items(const LoadPlan& plan, LoadPlanner& planner, const Metadata& metadata,
                const FileOpener& open, int rank, const ReadOptions& options) {
  const bool ranged_reads = options.ranged_reads;
  // Group by saved item, so each record is read once; then read the records in file and
  // offset order: each file is read front to back, which the kernel's read-ahead rewards (key
  // order would jump around the files, which are laid out by size).
  std::map<MetadataIndex, std::vector<const ReadItem*>> groups;
  for (const auto& item : plan.items) groups[item.storage_index].push_back(&item);
  struct Work {
    const std::vector<const ReadItem*>* items;
    const StorageInfo* info;
  };
  std::vector<Work> work;
  work.reserve(groups.size());
  for (const auto& [index, items] : groups) {
    auto info_it = metadata.storage_data.find(index);
    TORCH_CHECK(info_it != metadata.storage_data.end(), "rank ", rank,
                ": the checkpoint metadata has no storage entry for '", index.fqn, "'",
                index.offset ? " chunk at " + box_string(*index.offset) : std::string());
    work.push_back(Work{&items, &info_it->second});
  }
  std::sort(work.begin(), work.end(), [](const Work& a, const Work& b) {
    const int c = a.info->relative_path.compare(b.info->relative_path);
    return c != 0 ? c < 0 : a.info->offset < b.info->offset;
  });

  std::mutex files_mu;
  std::map<std::string, std::shared_ptr<const InputFile>> files;  // guarded by files_mu
  auto file = [&](const std::string& relative) {
    std::lock_guard<std::mutex> lock(files_mu);
    auto it = files.find(relative);
    if (it == files.end()) it = files.emplace(relative, open(relative)).first;
    return it->second;
  };

  // Note [Prefetch]: spans[w] are the ranges group w reads; ahead[w] is how many announced
  // bytes come before it. Groups up to `announced` have been announced.
  std::vector<std::vector<Span>> spans;
  std::vector<uint64_t> ahead;
  if (options.prefetch_bytes > 0) {
    spans.reserve(work.size());
    ahead.reserve(work.size() + 1);
    ahead.push_back(0);
    for (const Work& w : work) {
      spans.push_back(group_spans(*w.items, *w.info, metadata, ranged_reads));
      uint64_t bytes = 0;
      for (const Span& s : spans.back()) bytes += s.end - s.begin;
      ahead.push_back(ahead.back() + bytes);
    }
  }
  std::mutex announce_mu;
  size_t announced = 0;  // guarded by announce_mu
  auto announce_through = [&](size_t w) {
    if (options.prefetch_bytes == 0) return;
    std::lock_guard<std::mutex> lock(announce_mu);
    while (announced < work.size() &&
           (announced <= w || ahead[announced] - ahead[w] < options.prefetch_bytes)) {
      const size_t next = announced++;
      std::shared_ptr<const InputFile> f;
      try {
        f = file(work[next].info->relative_path);
      } catch (const c10::Error&) {
        continue;  // only a hint: reading that group will report the error, with its context
      }
      for (const Span& s : spans[next]) f->prefetch(s.begin, s.end - s.begin);
    }
  };

  run_parallel(work.size(), options.thread_count, [&](size_t w) {
    announce_through(w);
    const auto& items = *work[w].items;
    const MetadataIndex& index = items.front()->storage_index;
    const StorageInfo& info = *work[w].info;
    TORCH_CHECK_NOT_IMPLEMENTED(info.transform_descriptors.empty(), "rank ", rank, ": '",
                                index.fqn, "' is stored with transforms (",
                                info.transform_descriptors.front(),
                                "), which dcp does not read yet");
    try {
      ItemSource source(file(info.relative_path), info);
      if (items.front()->type == LoadItemType::BYTE_IO) {
        Value value = read_value_archive(source);
        for (const ReadItem* item : items) planner.load_bytes(*item, value);
        return;
      }
      if (!ranged_reads) {  // the simple path: the whole saved chunk, then copies
        const at::Tensor saved = read_tensor_archive(source);
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
        read_box(source, record, *item, dest);
        planner.commit_tensor(*item, dest);
      }
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "rank ", rank, ": reading '", index.fqn, "' from '",
                  info.relative_path, "' [", info.offset, ", ", info.offset + info.length,
                  "): ", e.what_without_backtrace());
    }
  });
}

}  // namespace dcp::detail
