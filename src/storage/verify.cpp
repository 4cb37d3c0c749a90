// dcp::verify (see dcp/verify.h):
//   1. read '.metadata' and compare it with its checksum file (a failure ends the check with
//      one problem);
//   2. per key: chunk geometry (validate_chunks), a storage entry for every chunk and byte item;
//   3. per file: a plain relative name of a regular file inside the directory; the entries'
//      ranges, sorted by offset, inside the file and disjoint;
//   4. per record, on `thread_count` threads: check every zip record's CRC-32, decode it whole and
//      compare the tensor with its chunk.
#include "dcp/verify.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "dcp/filesystem.h"
#include "format/stream_transform.h"
#include "format/torch_save.h"
#include "format/zip_directory.h"
#include "planner/planner_helpers.h"
#include "storage/metadata_file.h"
#include "storage/paths.h"
#include "storage/posix_input_file.h"
#include "storage/read_items.h"
#include "util/parallel.h"

namespace dcp {
namespace {

std::string message_of(const c10::Error& e) { return e.what_without_backtrace(); }

struct Record {
  const MetadataIndex* index;
  const StorageInfo* info;
  const TensorStorageMetadata* tensor;  // nullptr for a byte item
  const ChunkStorageMetadata* chunk;    // the chunk the record holds (tensors)
};

}  // namespace

VerifyReport verify(const std::string& checkpoint_id, const VerifyOptions& options) {
  TORCH_CHECK(options.thread_count >= 1, "verify: thread_count must be >= 1");
  VerifyReport report;
  auto problem = [&](std::string key, std::string file, int64_t begin, int64_t end,
                     std::string message) {
    report.problems.push_back(
        VerifyProblem{std::move(key), std::move(file), begin, end, std::move(message)});
  };
  Metadata md;
  try {
    detail::MetadataFile file = detail::read_metadata_file(checkpoint_id, /*check_checksum=*/true);
    md = std::move(file.metadata);
    report.metadata_checksum = detail::checksum_name(file.checksum);
  } catch (const c10::Error& e) {
    problem("", detail::paths::metadata_file(), -1, -1, message_of(e));
    return report;
  }

  // 2. Keys.
  std::vector<Record> records;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      const std::string geometry = detail::validate_chunks(fqn, *t, /*require_cover=*/true);
      if (!geometry.empty()) problem(fqn, "", -1, -1, geometry);
      for (const auto& chunk : t->chunks) {
        auto it = md.storage_data.find(MetadataIndex(fqn, chunk.offsets));
        if (it == md.storage_data.end()) {
          problem(fqn, "", -1, -1,
                  c10::str("no storage entry for the chunk at ", c10::IntArrayRef(chunk.offsets)));
          continue;
        }
        records.push_back(Record{&it->first, &it->second, t, &chunk});
      }
    } else {
      auto it = md.storage_data.find(MetadataIndex(fqn));
      if (it == md.storage_data.end()) {
        problem(fqn, "", -1, -1, "no storage entry for the value");
        continue;
      }
      records.push_back(Record{&it->first, &it->second, nullptr, nullptr});
    }
  }

  // 3. Files and ranges.
  std::map<std::string, std::vector<const Record*>> by_file;
  for (const Record& r : records) by_file[r.info->relative_path].push_back(&r);
  std::map<std::string, std::shared_ptr<const detail::InputFile>> files;
  std::vector<const Record*> readable;
  for (auto& [name, in_file] : by_file) {
    const std::string shown = detail::paths::printable(name);
    std::shared_ptr<const detail::InputFile> file;
    try {
      file = std::make_shared<detail::PosixInputFile>(checkpoint_id, name);
    } catch (const c10::Error& e) {
      problem(in_file.front()->index->fqn, shown, -1, -1, message_of(e));
      continue;
    }
    std::sort(in_file.begin(), in_file.end(), [](const Record* a, const Record* b) {
      return a->info->offset < b->info->offset;
    });
    int64_t end_of_previous = 0;
    for (const Record* r : in_file) {
      const StorageInfo& info = *r->info;
      const int64_t begin = info.offset;
      const bool sane = info.offset >= 0 && info.length >= 0 &&
                        info.length <= INT64_MAX - info.offset;
      const int64_t end = sane ? info.offset + info.length : -1;
      if (!sane || static_cast<uint64_t>(end) > file->size()) {
        problem(r->index->fqn, shown, begin, end,
                c10::str("the entry lies outside the file of ", file->size(), " bytes"));
        continue;
      }
      if (begin < end_of_previous) {
        problem(r->index->fqn, shown, begin, end, "the entry shares bytes with the one before it");
      }
      end_of_previous = std::max(end_of_previous, end);
      readable.push_back(r);
    }
    files[name] = std::move(file);
  }

  // 4. Records.
  std::mutex mu;  // guards report
  detail::run_parallel(readable.size(), options.thread_count, [&](size_t k) {
    const Record& r = *readable[k];
    const StorageInfo& info = *r.info;
    std::string failure;
    try {
      const detail::ItemSource item(files.at(info.relative_path), info);
      std::optional<detail::BufferSource> decoded;  // a compressed item, decompressed
      const uint64_t bound =
          detail::is_zstd_item(info.transform_descriptors)
              ? detail::decoded_size_bound(
                    r.tensor ? r.tensor->properties.dtype : c10::ScalarType::Byte, r.chunk,
                    r.index->fqn)
              : 0;
      const detail::ArchiveSource& source = detail::decoded_record(item, info, bound, decoded);
      detail::check_zip_records(source);
      if (r.tensor == nullptr) {
        detail::read_value_archive(source, /*verify_crc32=*/true);
      } else {
        const at::Tensor t = detail::read_tensor_archive(source, /*verify_crc32=*/true);
        TORCH_CHECK(t.sizes() == c10::IntArrayRef(r.chunk->sizes), "the record holds a tensor of ",
                    "shape ", t.sizes(), ", the chunk is ", c10::IntArrayRef(r.chunk->sizes));
        TORCH_CHECK(t.scalar_type() == r.tensor->properties.dtype, "the record holds ",
                    t.scalar_type(), ", the metadata says ", r.tensor->properties.dtype);
      }
    } catch (const c10::Error& e) {
      failure = message_of(e);
    }
    std::lock_guard<std::mutex> lock(mu);
    ++report.records;
    report.bytes += info.length;
    if (!failure.empty()) {
      problem(r.index->fqn, detail::paths::printable(info.relative_path), info.offset,
              info.offset + info.length, failure);
    }
    if (options.progress) options.progress(report.records, static_cast<int64_t>(readable.size()));
  });
  std::stable_sort(report.problems.begin(), report.problems.end(),
                   [](const VerifyProblem& a, const VerifyProblem& b) {
                     return a.key != b.key ? a.key < b.key : a.file < b.file;
                   });
  return report;
}

}  // namespace dcp
