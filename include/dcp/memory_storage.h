// In-memory storage: a real StorageWriter/StorageReader backend that keeps each checkpoint's
// files (the same '.metadata' pickle and '.distcp' records the file system gets) in process
// memory. Tests and planners use it to run the whole protocol without touching the disk; several
// ranks in one process (threads) share one MemoryStorage.
//
// Thread-safety: MemoryStorage is safe to use from several threads; each writer and reader is
// driven from one thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcp/storage.h"

namespace dcp {

/// A set of named checkpoints, each a set of named files.
class MemoryStorage {
 public:
  /// Stores `bytes` as file `name` of checkpoint `checkpoint_id` (replacing it).
  void put(const std::string& checkpoint_id, const std::string& name, std::string bytes);
  /// The file's bytes, or nullopt when absent.
  std::optional<std::shared_ptr<const std::string>> get(const std::string& checkpoint_id,
                                                        const std::string& name) const;
  bool remove(const std::string& checkpoint_id, const std::string& name);
  /// Names of the files of one checkpoint, sorted.
  std::vector<std::string> list(const std::string& checkpoint_id) const;

 private:
  mutable std::mutex mu_;  // guards files_
  std::map<std::string, std::map<std::string, std::shared_ptr<const std::string>>> files_;
};

struct MemoryWriterOptions {
  /// IO threads (and files) per rank, as FileSystemWriterOptions::thread_count.
  int thread_count = 1;
  /// One file per item instead of one per thread.
  bool single_file_per_rank = true;
};

/// Writes a checkpoint into a MemoryStorage (not owned; it must outlive the writer).
class MemoryWriter : public StorageWriter {
 public:
  MemoryWriter(MemoryStorage& storage, std::string checkpoint_id, MemoryWriterOptions options = {});

  // StorageWriter:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  void set_up_storage_writer(bool is_coordinator, int rank) override;
  SavePlan prepare_local_plan(SavePlan plan) override;
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans) override;
  std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                   SavePlanner& planner) override;
  void finish(const Metadata& metadata,
              const std::vector<std::vector<WriteResult>>& results) override;
  std::optional<StorageMeta> storage_meta() override;

 private:
  MemoryStorage& storage_;
  std::string checkpoint_id_;
  MemoryWriterOptions options_;
  std::vector<std::string> prefixes_;  // the coordinator's: this save's file prefixes
};

/// Reads a checkpoint from a MemoryStorage (not owned; it must outlive the reader).
class MemoryReader : public StorageReader {
 public:
  MemoryReader(MemoryStorage& storage, std::string checkpoint_id);

  // StorageReader:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  Metadata read_metadata() override;
  void set_up_storage_reader(const Metadata& metadata, bool is_coordinator, int rank) override;
  LoadPlan prepare_local_plan(LoadPlan plan) override;
  std::vector<LoadPlan> prepare_global_plan(std::vector<LoadPlan> plans) override;
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override;

 private:
  MemoryStorage& storage_;
  std::string checkpoint_id_;
  const Metadata* metadata_ = nullptr;  // set_up_storage_reader's, owned by its caller
};

}  // namespace dcp
