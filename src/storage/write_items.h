// The write side shared by file-like backends: spreading a rank's write items over data files
// the way Python DCP does, and appending each item's torch.save record to an output stream.
// FileSystemWriter and MemoryWriter differ only in where the bytes go.
#pragma once

#include <functional>
#include <future>
#include <string>
#include <vector>

#include "dcp/planner.h"
#include "dcp/storage.h"

namespace dcp::detail {

/// One data file and the items written to it, in order.
struct FileBucket {
  std::string relative_path;
  std::vector<const WriteItem*> items;
};

/// Python's layout (docs/format.md §1): with single_file_per_rank, `thread_count` files
/// "{prefix}{k}.distcp" (byte items dealt round robin, tensor items largest first to the
/// lightest file; byte items first within a file); otherwise one file per item in plan order.
/// Every bucket exists, even an empty one.
std::vector<FileBucket> assign_files(const SavePlan& plan, bool single_file_per_rank,
                                     int thread_count);

/// The data files among `names` (one directory's listing) that `metadata` does not reference
/// and that are not this save's own ("{prefix}{k}.distcp" for one of `own_prefixes`: a rank
/// with nothing to write still creates its files, as in Python): what a committed re-save
/// left behind (Note [Re-save] in filesystem_writer.cpp).
std::vector<std::string> unreferenced_data_files(const std::vector<std::string>& names,
                                                 const Metadata& metadata,
                                                 const std::vector<std::string>& own_prefixes);

/// An append-only byte stream (one data file being written).
class OutputStream {
 public:
  virtual ~OutputStream() = default;
  virtual void write(const void* data, size_t n) = 0;
  virtual uint64_t position() const = 0;
};

/// How items are encoded (FileSystemWriterOptions::compression).
struct ItemEncoding {
  bool zstd = false;     // Python's ZStandard extension: records pass through zstd
  int zstd_level = 3;
};

/// Resolves each item through the planner and appends its record. Errors keep their type and
/// gain the item, the file and the byte offset as context.
std::vector<WriteResult> write_bucket(const FileBucket& bucket, SavePlanner& planner,
                                      OutputStream& out, const ItemEncoding& encoding);
inline std::vector<WriteResult> write_bucket(const FileBucket& bucket, SavePlanner& planner,
                                             OutputStream& out) {
  return write_bucket(bucket, planner, out, ItemEncoding{});
}

/// Writes each bucket of `plan` with `write_file` (one call per file, on up to `thread_count`
/// threads) and returns all results, in bucket order, as a ready future (or its failure).
std::future<std::vector<WriteResult>> write_files(
    const SavePlan& plan, bool single_file_per_rank, int thread_count,
    const std::function<std::vector<WriteResult>(const FileBucket&)>& write_file);

}  // namespace dcp::detail
