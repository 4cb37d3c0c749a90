// FileSystemWriter and FileSystemReader: checkpoints as directories of files, in PyTorch DCP's
// layout ('.metadata' plus '__{rank}_{n}.distcp'), on a local or shared (NFS/Lustre-style)
// file system. Python's FileSystemWriter/FileSystemReader read and write the same directories.
//
// Commit protocol (docs/format.md): data files are written and fsynced under their final names
// (unique to the save when the directory already holds a checkpoint); then the coordinator
// writes '.metadata' to a temporary name, fsyncs it, renames it over '.metadata' and fsyncs the
// directory, and only then removes the files of the checkpoint it replaced. A checkpoint exists
// exactly when '.metadata' does; a re-save that fails leaves the previous one loadable; of two
// saves into one directory at the same time, the second fails before writing.
//
// Thread-safety: one instance per rank, driven from one thread (see dcp/storage.h).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcp/storage.h"

namespace dcp {
namespace detail {
class DirectoryLock;
struct FileBucket;
}  // namespace detail

/// How FileSystemWriter encodes items.
enum class Compression {
  kNone,
  /// zstd, as Python's FileSystemWriter(_extensions=[ZStandard()]): each item's record passes
  /// through one zstd frame and its storage metadata names the transform "stream.zstd/1".
  /// Python reads such checkpoints with the zstandard (or pyzstd) package installed; loads read
  /// each compressed item whole (a zstd stream cannot be read from the middle).
  kZstd,
};

struct FileSystemWriterOptions {
  /// One file per IO thread and rank ('__{rank}_{thread}.distcp'); false: one file per item.
  bool single_file_per_rank = true;
  /// fsync every data file and the metadata before committing.
  bool sync_files = true;
  /// IO threads per rank; items are spread over them as Python does.
  int thread_count = 1;
  /// Write data files and '.metadata' with O_DIRECT, through 4 MiB aligned staging buffers
  /// (four per file, so that the disk writes full ones while the next fills): the bytes bypass the
  /// page cache (faster on disks that outrun buffered writeback, and no cache pollution).
  /// Where the file system refuses O_DIRECT, writes are buffered, as with false.
  bool direct_io = true;
  /// Allow saving into a directory that already holds a checkpoint. The old checkpoint stays
  /// loadable until the new one commits (the new data files get names unique to the save);
  /// then the old files are removed.
  bool overwrite = true;
  /// With more than one rank, verify before writing that every rank sees the same directory
  /// (the coordinator writes a probe file that all ranks must read back). Turn off only for
  /// storage that is shared but slow to show new files, and then make sure it is shared.
  bool check_shared_directory = true;
  /// Item encoding (Python's _extensions); see Compression.
  Compression compression = Compression::kNone;
  /// zstd's level (1-19; 3 is zstd's default) when compression is kZstd.
  int zstd_level = 3;
};

/// Writes a checkpoint directory. `path` may be empty when dcp::save is given a checkpoint_id
/// (reset() sets it).
class FileSystemWriter : public StorageWriter {
 public:
  explicit FileSystemWriter(std::string path = "", FileSystemWriterOptions options = {});
  ~FileSystemWriter() override;

  const std::string& path() const { return path_; }

  // StorageWriter:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  void set_up_storage_writer(bool is_coordinator, int rank) override;
  void set_up_storage_writer_without_collectives(int rank) override;
  SavePlan prepare_local_plan(SavePlan plan) override;
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans) override;
  std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                   SavePlanner& planner) override;
  void finish(const Metadata& metadata,
              const std::vector<std::vector<WriteResult>>& results) override;
  std::optional<StorageMeta> storage_meta() override;
  std::string create_visibility_probe() override;
  bool sees_visibility_probe(const std::string& probe) override;
  void remove_visibility_probe(const std::string& probe) override;
  std::string visibility_probe_advice() override;
  void abort() override;

 private:
  std::vector<WriteResult> write_file(const std::string& file_path,
                                      const detail::FileBucket& bucket, SavePlanner& planner);
  void commit_metadata(const std::string& tmp_name, const std::string& final_name,
                       const Metadata& metadata, bool with_checksum);
  void replace_file(const std::string& tmp_name, const std::string& final_name,
                    const std::string& bytes);

  std::string path_;
  FileSystemWriterOptions options_;
  std::string save_id_;
  bool is_coordinator_ = false;
  std::optional<int> rank_local_;  // this rank, in a save without collectives
  std::unique_ptr<detail::DirectoryLock> lock_;  // the coordinator's (Note [Re-save])
  std::vector<std::string> prefixes_;              // the coordinator's: this save's file prefixes
  std::mutex written_mu_;
  std::vector<std::string> written_;  // data files this rank wrote in this save; guarded by written_mu_
};

struct FileSystemReaderOptions {
  /// IO threads per rank.
  int thread_count = 1;
  /// Read only the byte ranges the destination needs, straight into destination memory when
  /// the layouts allow. false forces the simple path: read each saved chunk whole, then copy.
  bool ranged_reads = true;
  /// How many bytes ahead of its reads the reader asks the kernel to start reading the ranges
  /// it will need next (posix_fadvise WILLNEED), so that the disk has more than one request to
  /// work on. Up to that much page cache is filled ahead of the reads; 0 turns it off.
  uint64_t prefetch_bytes = 32 << 20;
  /// Check the CRC-32 that each record's zip entry stores for its tensor data whenever a load
  /// reads the whole of it (any load in the saved layout; not a resharding read of part of a
  /// chunk). A mismatch is an error naming the item, file and range. See docs/reliability.md
  /// for its cost. It also compares '.metadata' with the size and CRC-32 its checksum file
  /// ('.metadata.checksum', written by dcp saves) records.
  bool verify_crc32 = true;
};

/// Reads a checkpoint directory written by dcp or by Python DCP.
class FileSystemReader : public StorageReader {
 public:
  explicit FileSystemReader(std::string path = "", FileSystemReaderOptions options = {});
  ~FileSystemReader() override;

  const std::string& path() const { return path_; }

  // StorageReader:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  Metadata read_metadata() override;
  void set_up_storage_reader(const Metadata& metadata, bool is_coordinator, int rank) override;
  LoadPlan prepare_local_plan(LoadPlan plan) override;
  std::vector<LoadPlan> prepare_global_plan(std::vector<LoadPlan> plans) override;
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override;

 private:
  std::string path_;
  FileSystemReaderOptions options_;
  const Metadata* metadata_ = nullptr;  // set_up_storage_reader's, owned by its caller
};

}  // namespace dcp
