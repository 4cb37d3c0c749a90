// Storage interfaces: where a checkpoint's bytes go. Call order and names follow Python's
// torch.distributed.checkpoint.storage. Implementations: FileSystemWriter/Reader
// (dcp/filesystem.h) and the in-memory storage (dcp/memory_storage.h); StorageWriterWrapper and
// StorageReaderWrapper forward every call, so fault injection or tracing is a short subclass.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner.h"

namespace dcp {

/// Where one written item landed.
struct WriteResult {
  MetadataIndex index;
  int64_t size_in_bytes = 0;
  StorageInfo storage_data;
};

/// Writes one checkpoint; one instance per rank. dcp::save calls, in order:
///   all ranks:   reset(checkpoint_id)                 (only when a checkpoint_id is given)
///   all ranks:   storage_meta()
///   (more than one rank: the shared-storage check)
///   coordinator: create_visibility_probe()          -> probe ("" when nothing to check)
///   all ranks:   sees_visibility_probe(probe)
///   coordinator: remove_visibility_probe(probe)
///   all ranks:   set_up_storage_writer(is_coordinator, rank)
///   all ranks:   prepare_local_plan(plan)             (creates the directory, overwrite check)
///   coordinator: prepare_global_plan(plans)           (assigns each rank's file prefix)
///   all ranks:   write_data(plan, planner)            -> future of results
///   coordinator: finish(metadata, all_results)        (commits the checkpoint)
///   all ranks:   abort()                              (only when the save failed, on any rank)
/// The metadata given to finish is complete: storage_data already holds every rank's results.
/// A save without collectives (SaveOptions::use_collectives = false) calls, on every rank alone:
/// reset, storage_meta, set_up_storage_writer_without_collectives(rank), prepare_local_plan,
/// prepare_global_plan({plan}), write_data, finish(metadata of this rank, {results}), abort.
/// Not thread-safe: each rank drives it from one thread.
class StorageWriter {
 public:
  virtual ~StorageWriter() = default;
  StorageWriter() = default;
  StorageWriter(const StorageWriter&) = delete;
  StorageWriter& operator=(const StorageWriter&) = delete;

  virtual void reset(const std::optional<std::string>& checkpoint_id) = 0;
  virtual void set_up_storage_writer(bool is_coordinator, int rank) = 0;
  virtual SavePlan prepare_local_plan(SavePlan plan) = 0;
  virtual std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans) = 0;
  virtual std::future<std::vector<WriteResult>> write_data(const SavePlan& plan,
                                                           SavePlanner& planner) = 0;
  virtual void finish(const Metadata& metadata,
                      const std::vector<std::vector<WriteResult>>& results) = 0;
  /// What to record in Metadata.storage_meta; nullopt when the backend records nothing.
  virtual std::optional<StorageMeta> storage_meta() { return std::nullopt; }
  /// Python's set_up_storage_writer(..., use_collectives=False), instead of
  /// set_up_storage_writer: this rank saves alone and must keep its files and its metadata
  /// apart from the other ranks' (FileSystemWriter: "__{rank}.metadata"). The default refuses.
  virtual void set_up_storage_writer_without_collectives(int rank);

  /// The shared-storage check: the coordinator leaves a probe in the storage and every rank must
  /// see it, so that ranks writing to storage the others cannot read (node-local disks) fail
  /// before writing anything. Backends without such a risk keep the defaults (no probe).
  virtual std::string create_visibility_probe() { return ""; }
  virtual bool sees_visibility_probe(const std::string& probe) { return true; }
  virtual void remove_visibility_probe(const std::string& probe) {}
  /// What to tell the user when some rank cannot see the probe: how this backend's storage
  /// must be set up, and how to turn the check off. Appended to the error.
  virtual std::string visibility_probe_advice() { return ""; }
  /// The save failed (on this rank or another): release what it holds and remove what it wrote
  /// that no committed checkpoint references. Called on every rank, once, before the save's
  /// error is rethrown. Never throws.
  virtual void abort() {}
};

/// Reads one checkpoint; one instance per rank. dcp::load calls, in order:
///   all ranks:   reset(checkpoint_id)                 (only when a checkpoint_id is given)
///   all ranks:   read_metadata()
///   all ranks:   set_up_storage_reader(metadata, is_coordinator, rank)
///   all ranks:   prepare_local_plan(plan)
///   coordinator: prepare_global_plan(plans)
///   all ranks:   read_data(plan, planner)             -> future that completes when done
/// The Metadata given to set_up_storage_reader outlives read_data (dcp::load owns it): a reader
/// keeps a reference, as Python's readers keep `metadata.storage_data`, not a copy.
/// Not thread-safe: each rank drives it from one thread.
class StorageReader {
 public:
  virtual ~StorageReader() = default;
  StorageReader() = default;
  StorageReader(const StorageReader&) = delete;
  StorageReader& operator=(const StorageReader&) = delete;

  virtual void reset(const std::optional<std::string>& checkpoint_id) = 0;
  /// The checkpoint's Metadata. A reader that produces a large storage_data out of key order
  /// collects its entries and builds it with StorageData::from_unsorted.
  virtual Metadata read_metadata() = 0;
  virtual void set_up_storage_reader(const Metadata& metadata, bool is_coordinator, int rank) = 0;
  virtual LoadPlan prepare_local_plan(LoadPlan plan) = 0;
  virtual std::vector<LoadPlan> prepare_global_plan(std::vector<LoadPlan> plans) = 0;
  virtual std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) = 0;
};

/// Forwards every call to a wrapped writer, which it shares: a wrapper can be handed to
/// async_save, whose background save keeps it (and so its target) alive.
class StorageWriterWrapper : public StorageWriter {
 public:
  /// REQUIRES: target != nullptr.
  explicit StorageWriterWrapper(std::shared_ptr<StorageWriter> target);

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
  void set_up_storage_writer_without_collectives(int rank) override;
  std::string create_visibility_probe() override;
  bool sees_visibility_probe(const std::string& probe) override;
  void remove_visibility_probe(const std::string& probe) override;
  std::string visibility_probe_advice() override;
  void abort() override;

 protected:
  StorageWriter& target() { return *target_; }

 private:
  std::shared_ptr<StorageWriter> target_;
};

/// Forwards every call to a wrapped reader, which it shares.
class StorageReaderWrapper : public StorageReader {
 public:
  /// REQUIRES: target != nullptr.
  explicit StorageReaderWrapper(std::shared_ptr<StorageReader> target);

  // StorageReader:
  void reset(const std::optional<std::string>& checkpoint_id) override;
  Metadata read_metadata() override;
  void set_up_storage_reader(const Metadata& metadata, bool is_coordinator, int rank) override;
  LoadPlan prepare_local_plan(LoadPlan plan) override;
  std::vector<LoadPlan> prepare_global_plan(std::vector<LoadPlan> plans) override;
  std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner) override;

 protected:
  StorageReader& target() { return *target_; }

 private:
  std::shared_ptr<StorageReader> target_;
};

}  // namespace dcp
