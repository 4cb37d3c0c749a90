// The write side of file-like backends (see write_items.h).
//
// A rank's items go to files as Python lays them out (assign_files); each file is written by one
// IO thread: for each item (byte items first, then tensors), resolve its payload through the
// planner, append a torch.save record at the stream's position, record (file, offset, length).
#include "storage/write_items.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "format/stream_transform.h"
#include "format/torch_save.h"
#include "storage/paths.h"
#include "util/error_context.h"
#include "util/parallel.h"

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
                                      OutputStream& out, const ItemEncoding& encoding) {
  std::vector<WriteResult> results;
  results.reserve(bucket.items.size());
  const ByteSink file_sink = [&out](const void* data, size_t n) { out.write(data, n); };
  for (const WriteItem* item : bucket.items) {
    const uint64_t start = out.position();
    with_context(
        [&] {
          std::optional<ZstdCompressor> zstd;
          if (encoding.zstd) zstd.emplace(file_sink, encoding.zstd_level);
          const ByteSink sink = zstd ? ByteSink([&zstd](const void* data, size_t n) {
            zstd->write(data, n);
          })
                                     : file_sink;
          WritePayload payload = planner.resolve_data(*item);
          if (auto* tensor = std::get_if<at::Tensor>(&payload)) {
            TORCH_CHECK(item->type != WriteItemType::BYTE_IO,
                        "planner resolved a byte item to a tensor");
            // detach() makes a new tensor object (about 1 us a record, a twentieth of a small
            // record's cost); a CPU tensor without autograd is written as it is.
            const bool as_is = tensor->is_cpu() && !tensor->requires_grad();
            write_tensor_archive(as_is ? *tensor : tensor->detach().cpu(), sink);
          } else {
            write_value_archive(std::get<Value>(payload), sink);
          }
          if (zstd) zstd->finish();
        },
        [&] {
          return c10::str("writing '", item->index.fqn, "' to '", bucket.relative_path,
                          "' at byte ", start);
        });
    WriteResult r;
    r.index = item->index;
    const uint64_t length = out.position() - start;
    r.size_in_bytes = static_cast<int64_t>(length);
    r.storage_data = StorageInfo{bucket.relative_path, static_cast<int64_t>(start),
                                 static_cast<int64_t>(length), {}};
    if (encoding.zstd) r.storage_data.transform_descriptors = {kZstdDescriptor};
    results.push_back(std::move(r));
  }
  return results;
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

std::vector<std::string> unreferenced_data_files(const std::vector<std::string>& names,
                                                 const Metadata& metadata,
                                                 const std::vector<std::string>& own_prefixes) {
  std::set<std::string> referenced;
  for (const auto& [index, info] : metadata.storage_data) referenced.insert(info.relative_path);
  auto own = [&](const std::string& name) {
    for (const std::string& prefix : own_prefixes) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      // the rest must be "{k}.distcp"
      const size_t dot = name.find('.', prefix.size());
      if (dot == prefix.size() || dot == std::string::npos) continue;
      if (name.compare(dot, std::string::npos, ".distcp") != 0) continue;
      if (std::all_of(name.begin() + prefix.size(), name.begin() + dot,
                      [](char c) { return c >= '0' && c <= '9'; })) {
        return true;
      }
    }
    return false;
  };
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (paths::is_data_file(name) && referenced.count(name) == 0 && !own(name)) {
      out.push_back(name);
    }
  }
  return out;
}

}  // namespace dcp::detail
