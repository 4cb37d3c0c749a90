// Shared item IO for file-like backends (see item_io.h).
//
// Writing one bucket:
//   for each item (byte items first, then tensors): resolve its payload through the planner,
//   append a torch.save record at the stream's position, record (file, offset, length).
// Reading a plan:
//   group read items by the saved item they read (storage_index); visit the groups in file
//   and offset order (each file front to back); for each group read the record once; byte
//   items go to planner.load_bytes, tensor boxes are narrowed and copied into
//   planner.resolve_tensor's destination, then commit_tensor.
#include "storage/item_io.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

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

// Note [Ranged reads]: only the bytes between the box's first and last element are read, and
// when they are exactly the box in row-major order and the destination is a contiguous tensor
// of the same dtype, they are read straight into the destination's memory. A row-sharded
// reshard thus reads what it needs and nothing else, with no intermediate copy.
void read_box(const ArchiveSource& source, const TensorRecord& record, const ReadItem& item,
              at::Tensor& dest) {
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(record.dtype));
  int64_t first = record.storage_offset, last = record.storage_offset, numel = 1;
  for (size_t d = 0; d < record.sizes.size(); ++d) {
    if (item.lengths[d] == 0) return;  // nothing to copy
    first += item.storage_offsets[d] * record.strides[d];
    last += (item.storage_offsets[d] + item.lengths[d] - 1) * record.strides[d];
    numel *= item.lengths[d];
  }
  const int64_t count = last - first + 1;
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

}  // namespace

void read_items(const LoadPlan& plan, LoadPlanner& planner, const Metadata& metadata,
                const FileOpener& open, int thread_count, int rank, bool ranged_reads) {
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

  run_parallel(work.size(), thread_count, [&](size_t w) {
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
