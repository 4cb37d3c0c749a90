// Save and load planners: what to write and where each saved byte goes on load. Names and call
// order follow Python's torch.distributed.checkpoint.planner; DefaultSavePlanner and
// DefaultLoadPlanner implement Python's default behaviour (flattening, de-duplication of
// replicated items, chunk-overlap resharding) plus dcp's stricter checks on load.
//
// Planners never do IO and never call collectives. One planner instance serves one rank and is
// driven from one thread; a DefaultSavePlanner with enable_plan_caching is meant to serve every
// save of its rank in turn.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner_data.h"
#include "dcp/state_dict.h"

namespace dcp {

enum class WriteItemType { TENSOR, SHARD, BYTE_IO };
enum class LoadItemType { TENSOR, BYTE_IO };

/// What a tensor write item covers: its chunk, the tensor's properties and global shape.
struct TensorWriteData {
  ChunkStorageMetadata chunk;
  TensorProperties properties;
  Dims size;
};

/// One item a rank proposes to write.
struct WriteItem {
  MetadataIndex index;
  WriteItemType type = WriteItemType::BYTE_IO;
  std::optional<TensorWriteData> tensor_data;  // set for TENSOR and SHARD

  /// Bytes this item's payload takes (elements x element size of the chunk; 0 for BYTE_IO).
  int64_t tensor_storage_size() const;
};

/// One rank's items. `storage_data` belongs to the StorageWriter (FileSystemWriter keeps the
/// rank's file prefix "__{rank}_" there); `planner_data` to the planner (a map that plans share
/// until one changes it: dcp/planner_data.h).
struct SavePlan {
  std::vector<WriteItem> items;
  std::string storage_data;
  PlannerData planner_data;
  bool usable = true;
};

/// One read: copy the box `lengths` at `storage_offsets` of saved chunk `storage_index` into the
/// box at `dest_offsets` of destination chunk `dest_index`.
struct ReadItem {
  LoadItemType type = LoadItemType::TENSOR;
  MetadataIndex dest_index;
  Dims dest_offsets;
  MetadataIndex storage_index;
  Dims storage_offsets;
  Dims lengths;
};

struct LoadPlan {
  std::vector<ReadItem> items;
  std::string storage_data;
};

/// What a write item's payload resolves to: a CPU tensor chunk, or a non-tensor value.
using WritePayload = std::variant<at::Tensor, Value>;

/// Decides what a rank writes. dcp::save calls, in order:
///   all ranks:   set_up_planner(state, storage_meta, is_coordinator)
///   all ranks:   create_local_plan()
///   coordinator: create_global_plan(all local plans)   -> final plans and Metadata
///   all ranks:   finish_plan(this rank's final plan)
///   all ranks:   resolve_data(item) for every item, from the storage's IO threads
/// resolve_data may be called concurrently from several threads; everything else is called
/// from the thread that runs dcp::save.
class SavePlanner {
 public:
  virtual ~SavePlanner() = default;
  SavePlanner() = default;
  SavePlanner(const SavePlanner&) = delete;
  SavePlanner& operator=(const SavePlanner&) = delete;

  virtual void set_up_planner(const StateDict& state, const std::optional<StorageMeta>& meta,
                              bool is_coordinator) = 0;
  virtual SavePlan create_local_plan() = 0;
  virtual std::pair<std::vector<SavePlan>, Metadata> create_global_plan(
      std::vector<SavePlan> plans) = 0;
  virtual SavePlan finish_plan(SavePlan central_plan) = 0;
  virtual WritePayload resolve_data(const WriteItem& item) = 0;
};

/// Decides what a rank reads and where it goes. dcp::load calls, in order:
///   all ranks:   set_up_planner(state, metadata, is_coordinator)
///   all ranks:   create_local_plan()
///   coordinator: create_global_plan(all local plans)
///   all ranks:   finish_plan(this rank's final plan)
///   all ranks:   load_bytes / resolve_tensor + commit_tensor for every read item
/// resolve_tensor/commit_tensor may be called concurrently for different items.
class LoadPlanner {
 public:
  virtual ~LoadPlanner() = default;
  LoadPlanner() = default;
  LoadPlanner(const LoadPlanner&) = delete;
  LoadPlanner& operator=(const LoadPlanner&) = delete;

  virtual void set_up_planner(StateDict& state, const Metadata& metadata, bool is_coordinator) = 0;
  virtual LoadPlan create_local_plan() = 0;
  virtual std::vector<LoadPlan> create_global_plan(std::vector<LoadPlan> plans) = 0;
  virtual LoadPlan finish_plan(LoadPlan central_plan) = 0;
  /// Stores a loaded non-tensor value (replacing what the state dict held).
  virtual void load_bytes(const ReadItem& item, Value value) = 0;
  /// Returns the destination view for a tensor read; the storage copies into it.
  virtual at::Tensor resolve_tensor(const ReadItem& item) = 0;
  /// Called after the copy into resolve_tensor's result finished.
  virtual void commit_tensor(const ReadItem& item, const at::Tensor& tensor) = 0;
};

struct DefaultSavePlannerOptions {
  /// Flatten nested dicts and lists to dotted keys, as Python's flatten_state_dict=True.
  bool flatten_state_dict = true;
  /// Keep each replicated item on the lowest rank that has it instead of balancing bytes
  /// (Python's dedup_save_to_lowest_rank).
  bool dedup_save_to_lowest_rank = false;
  /// Python's enable_plan_caching: when a rank's local plan equals its previous save's, it
  /// sends an empty "unchanged" plan, and when no rank's plan changed the coordinator reuses
  /// the previous global plan and Metadata instead of recomputing them (Note [Plan caching]).
  /// The cache lives in the planner: pass the same planner to every save of a rank
  /// (SaveOptions::planner), one planner per rank.
  bool enable_plan_caching = false;
};

/// Python's DefaultSavePlanner.
class DefaultSavePlanner : public SavePlanner {
 public:
  explicit DefaultSavePlanner(DefaultSavePlannerOptions options = {});

  // SavePlanner:
  void set_up_planner(const StateDict& state, const std::optional<StorageMeta>& meta,
                      bool is_coordinator) override;
  SavePlan create_local_plan() override;
  std::pair<std::vector<SavePlan>, Metadata> create_global_plan(
      std::vector<SavePlan> plans) override;
  SavePlan finish_plan(SavePlan central_plan) override;
  /// transform_object(item, lookup_object(item.index)), as in Python.
  WritePayload resolve_data(const WriteItem& item) override;

  /// With enable_plan_caching, on the coordinator: how many global plans were asked for, and
  /// how many of them reused the cached global plan and Metadata whole.
  struct PlanCacheStats {
    int64_t global_plans = 0;
    int64_t global_plan_hits = 0;
  };
  PlanCacheStats plan_cache_stats() const { return cache_stats_; }

 protected:
  /// Hooks for subclasses, with Python's names. Called from IO threads, concurrently.
  /// The object an index names in this rank's state dict: a local shard or tensor (CPU or
  /// device), or a non-tensor value. Throws when the state dict has no such object.
  virtual WritePayload lookup_object(const MetadataIndex& index) const;
  /// What is written for `item`: by default `object` itself (storage serializes values).
  virtual WritePayload transform_object(const WriteItem& item, WritePayload object);

 private:
  std::pair<std::vector<SavePlan>, Metadata> plan_globally(std::vector<SavePlan> plans) const;
  static SavePlan unusable_plan();

  DefaultSavePlannerOptions options_;
  FlatStateDict flat_;  // its mappings moved to mappings_
  std::unordered_map<std::string, size_t> by_fqn_;  // flat_'s index of each key
  PlannerData mappings_;  // each local plan's planner_data: shared, not copied
  bool is_coordinator_ = false;
  // Note [Plan caching] (default_planner.cpp): what the previous successful save planned.
  struct PlanCache {
    std::optional<SavePlan> local_plan;  // this rank's local plan
    std::optional<SavePlan> final_plan;  // this rank's final plan
    std::vector<SavePlan> all_plans;     // coordinator: every rank's local plan
    std::optional<Metadata> metadata;    // coordinator: the global plan's Metadata
  } cache_;
  std::optional<SavePlan> pending_local_plan_;  // cached once the global plan succeeded
  PlanCacheStats cache_stats_;
};

struct DefaultLoadPlannerOptions {
  /// Skip state-dict keys that the checkpoint lacks instead of raising (Python's option).
  bool allow_partial_load = false;
  /// Convert saved dtypes to the destination's. Python converts silently; dcp raises a
  /// dtype-mismatch error unless this is set.
  bool allow_dtype_cast = false;
  /// Flatten the destination state dict (must match how the checkpoint was saved).
  bool flatten_state_dict = true;
};

/// Python's DefaultLoadPlanner.
class DefaultLoadPlanner : public LoadPlanner {
 public:
  explicit DefaultLoadPlanner(DefaultLoadPlannerOptions options = {});

  // LoadPlanner:
  void set_up_planner(StateDict& state, const Metadata& metadata, bool is_coordinator) override;
  LoadPlan create_local_plan() override;
  std::vector<LoadPlan> create_global_plan(std::vector<LoadPlan> plans) override;
  LoadPlan finish_plan(LoadPlan central_plan) override;
  void load_bytes(const ReadItem& item, Value value) override;
  /// transform_tensor(item, lookup_tensor(item.dest_index)), as in Python.
  at::Tensor resolve_tensor(const ReadItem& item) override;
  void commit_tensor(const ReadItem& item, const at::Tensor& tensor) override;

 protected:
  /// Hooks for subclasses, with Python's names. Called from IO threads, concurrently.
  /// The destination tensor (or local shard) an index names. Throws when there is none.
  virtual at::Tensor lookup_tensor(const MetadataIndex& index) const;
  /// The view of `tensor` that `item` fills: by default its box at item.dest_offsets with
  /// item.lengths (Python's narrow_tensor_by_index).
  virtual at::Tensor transform_tensor(const ReadItem& item, const at::Tensor& tensor);

 private:
  DefaultLoadPlannerOptions options_;
  std::mutex mu_;  // guards *state_ during load_bytes (called from IO threads)
  StateDict* state_ = nullptr;
  const Metadata* metadata_ = nullptr;  // owned by the caller of set_up_planner
  FlatStateDict flat_;
  std::unordered_map<std::string, size_t> by_fqn_;  // flat_'s index of each key
};

/// Python's _EmptyStateDictLoadPlanner: loads a checkpoint without a destination. Given an
/// empty state dict, it builds one from the metadata (a tensor of each saved global shape and
/// dtype, None for each value, nested again through planner_data) and loads into it. `keys`
/// keeps only those flat keys and the keys below them ("model" keeps "model.w"); empty: all.
/// Every rank builds the whole selection.
class EmptyStateDictLoadPlanner : public DefaultLoadPlanner {
 public:
  explicit EmptyStateDictLoadPlanner(std::vector<std::string> keys = {});
  /// Throws when `state` is not empty, or when `keys` selects nothing.
  void set_up_planner(StateDict& state, const Metadata& metadata, bool is_coordinator) override;

 private:
  std::vector<std::string> keys_;
};

}  // namespace dcp
