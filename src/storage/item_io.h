// What every file-like backend shares: spreading a rank's write items over files the way Python
// DCP does, appending each item's torch.save record to an output stream, and executing a load
// plan against random-access input files. FileSystemWriter/Reader and the in-memory storage
// differ only in where the bytes go.
#pragma once

#include <functional>
#include <future>
#include <memory>
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

/// Python's layout (reference §1.2): with single_file_per_rank, `thread_count` files
/// "{prefix}{k}.distcp" (byte items dealt round robin, tensor items largest first to the
/// lightest file; byte items first within a file); otherwise one file per item in plan order.
/// Every bucket exists, even an empty one.
std::vector<FileBucket> assign_files(const SavePlan& plan, bool single_file_per_rank,
                                     int thread_count);

/// An append-only byte stream (one data file being written).
class OutputStream {
 public:
  virtual ~OutputStream() = default;
  virtual void write(const void* data, size_t n) = 0;
  virtual uint64_t position() const = 0;
};

/// Resolves each item through the planner and appends its record. Errors name the item, the
/// file and the rank.
std::vector<WriteResult> write_bucket(const FileBucket& bucket, SavePlanner& planner,
                                      OutputStream& out, int rank);

/// Runs task(0..n-1) on up to `threads` threads; rethrows the first failure after all ended.
void run_parallel(size_t n, int threads, const std::function<void(size_t)>& task);

/// Writes each bucket of `plan` with `write_file` (one call per file, on up to `thread_count`
/// threads) and returns all results, in bucket order, as a ready future (or its failure).
std::future<std::vector<WriteResult>> write_files(
    const SavePlan& plan, bool single_file_per_rank, int thread_count,
    const std::function<std::vector<WriteResult>(const FileBucket&)>& write_file);

/// A read-only random-access file.
class InputFile {
 public:
  virtual ~InputFile() = default;
  virtual const std::string& name() const = 0;
  virtual uint64_t size() const = 0;
  /// Reads exactly n bytes at `offset`; throws naming the file and range otherwise.
  virtual void read(uint64_t offset, void* dst, size_t n) const = 0;
  /// A hint that [offset, offset + n) will be read soon: a file on disk starts reading it in
  /// the background. Never throws; the default does nothing.
  virtual void prefetch(uint64_t offset, uint64_t n) const {}
};

using FileOpener = std::function<std::shared_ptr<const InputFile>(const std::string& relative)>;

/// How read_items reads.
struct ReadOptions {
  /// IO threads.
  int thread_count = 1;
  /// Read only the byte range each read needs, straight into the destination when the layout
  /// allows (Note [Ranged reads]); false reads each saved chunk whole and copies from it (the
  /// simple path).
  bool ranged_reads = true;
  /// How many bytes of the coming reads to announce to the files ahead of reading them (Note
  /// [Prefetch]); 0 announces nothing.
  uint64_t prefetch_bytes = 0;
};

/// Executes a load plan: for every saved item the plan touches, hands the pieces to the planner
/// (load_bytes, or resolve_tensor + copy + commit_tensor). Errors name the rank, the item, the
/// file and the record's range.
void read_items(const LoadPlan& plan, LoadPlanner& planner, const Metadata& metadata,
                const FileOpener& open, int rank, const ReadOptions& options = {});

}  // namespace dcp::detail
