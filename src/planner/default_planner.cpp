// DefaultSavePlanner and DefaultLoadPlanner (Python's default_planner), plus the global save
// plan that turns every rank's items into Metadata.
//
// Save: flatten -> one item per tensor (TENSOR, offsets 0) or other value (BYTE_IO) ->
//       coordinator: de-duplicate, build Metadata, validate chunks.
// Load: flatten the destination -> for each key: missing (error naming the nearest saved key,
//       or skip with allow_partial_load), bytes (one BYTE_IO read), or tensor (shape and dtype
//       checks, then chunk-overlap reads).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <mutex>
#include <sstream>

#include "dcp/planner.h"
#include "util/name_interner.h"
#include "planner/planner_helpers.h"

namespace dcp {

int64_t WriteItem::tensor_storage_size() const {
  if (!tensor_data) return 0;
  int64_t n = static_cast<int64_t>(c10::elementSize(tensor_data->properties.dtype));
  for (int64_t s : tensor_data->chunk.sizes) n *= s;
  return n;
}

namespace {

// flatten_state_dict=False: the top-level values are the leaves.
FlatStateDict top_level_items(const StateDict& state) {
  FlatStateDict flat;
  for (const auto& [k, v] : state) {
    const std::string key = key_to_string(k);
    flat.items.emplace_back(key, v);
    flat.mappings.emplace(key, ObjectPath{Key(key)});
  }
  return flat;
}

std::unordered_map<std::string, size_t> index_by_fqn(const FlatStateDict& flat) {
  std::unordered_map<std::string, size_t> by_fqn;
  by_fqn.reserve(flat.items.size());
  for (size_t i = 0; i < flat.items.size(); ++i) by_fqn.emplace(flat.items[i].first, i);
  return by_fqn;
}

// The destination as the reads may write it: a tensor that requires grad is detached (a leaf
// that requires grad refuses in-place writes); any other is itself, which saves a TensorImpl
// per read item (20,000 per rank in a load of small tensors).
at::Tensor writable(const at::Tensor& t) { return t.requires_grad() ? t.detach() : t; }

TensorProperties properties_of(const at::Tensor& t) {
  TensorProperties p;
  p.dtype = t.scalar_type();
  p.layout = t.layout();
  p.requires_grad = t.requires_grad();
  p.pin_memory = t.is_pinned();
  return p;
}

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Global save plan

namespace detail {

bool compare_save_plans(const SavePlan& a, const SavePlan& b) {
  if (a.usable != b.usable || a.items.size() != b.items.size() ||
      a.storage_data != b.storage_data || a.planner_data != b.planner_data) {
    return false;
  }
  for (size_t i = 0; i < a.items.size(); ++i) {
    const WriteItem& x = a.items[i];
    const WriteItem& y = b.items[i];
    if (x.type != y.type || x.index != y.index || x.index.index != y.index.index ||
        x.tensor_data.has_value() != y.tensor_data.has_value()) {
      return false;
    }
    if (x.tensor_data && !(x.tensor_data->chunk == y.tensor_data->chunk &&
                           x.tensor_data->size == y.tensor_data->size &&
                           x.tensor_data->properties == y.tensor_data->properties)) {
      return false;
    }
  }
  return true;
}

std::pair<std::vector<SavePlan>, Metadata> create_default_global_save_plan(
    std::vector<SavePlan> plans) {
  Metadata md;
  md.planner_data.emplace();
  // Entries by interned name: a save has far fewer names than items, and every item looks its
  // name up. The interner keeps views into the plans' names, which outlive it.
  NameInterner names;
  std::vector<StorageMetadata*> entry_of;
  const PlannerData* merged_from = nullptr;  // the planner_data merged last
  for (auto& plan : plans) {
    for (size_t p = 0; p < plan.items.size(); ++p) {
      WriteItem& item = plan.items[p];
      const uint32_t id = names.intern(item.index.fqn).first;
      const bool seen = id < entry_of.size();
      if (!seen) {
        auto it = item.type == WriteItemType::BYTE_IO
                      ? md.state_dict_metadata.emplace(item.index.fqn, BytesStorageMetadata{}).first
                      : md.state_dict_metadata.emplace(item.index.fqn, TensorStorageMetadata{}).first;
        entry_of.push_back(&it->second);
      }
      if (item.type == WriteItemType::BYTE_IO) {
        TORCH_CHECK_VALUE(!seen, "'", item.index.fqn,
                          "' is saved twice with different kinds or offsets");
        continue;
      }
      TORCH_INTERNAL_ASSERT(item.tensor_data.has_value(), "tensor item without tensor data");
      auto* t = std::get_if<TensorStorageMetadata>(entry_of[id]);
      TORCH_CHECK_VALUE(t != nullptr, "'", item.index.fqn,
                        "' is saved both as a tensor and as a non-tensor value");
      if (!seen) {
        t->properties = item.tensor_data->properties;
        t->size = item.tensor_data->size;
      }
      TORCH_CHECK_VALUE(item.type == WriteItemType::SHARD || t->chunks.empty(), "'",
                        item.index.fqn, "' is saved as a whole tensor by several ranks with ",
                        "different offsets");
      TORCH_CHECK_VALUE(t->size == item.tensor_data->size &&
                            t->properties.dtype == item.tensor_data->properties.dtype,
                        "ranks disagree on the shape or dtype of '", item.index.fqn, "'");
      item.index.index = static_cast<int64_t>(t->chunks.size());
      t->chunks.push_back(item.tensor_data->chunk);
    }
    // Merge planner_data (the first rank to name a key wins, as Python's ChainMap): both maps
    // are sorted, so one walk finds each key's place; ranks mostly share every key. A map
    // shared with the plan merged before adds nothing (Note [Shared planner_data]).
    if (merged_from != nullptr && plan.planner_data.shares_with(*merged_from)) continue;
    merged_from = &plan.planner_data;
    auto& merged = *md.planner_data;
    auto at = merged.begin();
    for (const auto& [fqn, path] : plan.planner_data) {
      int c = -1;
      while (at != merged.end() && (c = at->first.compare(fqn)) < 0) ++at;
      if (at != merged.end() && c == 0) {
        ++at;
        continue;
      }
      merged.emplace_hint(at, fqn, path);
    }
  }
  const std::string problem = validate_global_plan(md, plans.size());
  TORCH_CHECK_VALUE(problem.empty(), "Failed to validate global plan: ", problem);
  return {std::move(plans), std::move(md)};
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// DefaultSavePlanner

DefaultSavePlanner::DefaultSavePlanner(DefaultSavePlannerOptions options) : options_(options) {}

void DefaultSavePlanner::set_up_planner(const StateDict& state,
                                        const std::optional<StorageMeta>& meta,
                                        bool is_coordinator) {
  flat_ = options_.flatten_state_dict ? flatten_state_dict(state) : top_level_items(state);
  by_fqn_ = index_by_fqn(flat_);
  // Shared by the local plans (dcp/planner_data.h): a copy per plan cost a tenth of a 1-rank
  // plan step for 20,000 values.
  mappings_ = PlannerData(std::move(flat_.mappings));
  flat_.mappings.clear();
  is_coordinator_ = is_coordinator;
}

SavePlan DefaultSavePlanner::create_local_plan() {
  SavePlan plan;
  for (const auto& [fqn, value] : flat_.items) {
    if (value.is_sharded_tensor()) {
      const ShardedTensor& st = value.get<ShardedTensor>();
      TensorProperties props;
      props.dtype = st.dtype();
      for (const Shard& shard : st.local_shards()) {
        WriteItem item;
        item.type = WriteItemType::SHARD;
        item.index = MetadataIndex(fqn, shard.offsets);
        item.tensor_data =
            TensorWriteData{ChunkStorageMetadata{Dims(shard.offsets), Dims(shard.tensor.sizes())},
                            props, Dims(st.global_shape())};
        plan.items.push_back(std::move(item));
      }
      continue;
    }
    WriteItem item;
    if (value.is_tensor()) {
      const at::Tensor& t = value.tensor();
      TORCH_CHECK(t.defined(), "'", fqn, "' is an undefined tensor");
      const Dims shape(t.sizes());
      item.type = WriteItemType::TENSOR;
      item.index = MetadataIndex(fqn, Dims(shape.size(), 0));
      item.tensor_data = TensorWriteData{ChunkStorageMetadata{Dims(shape.size(), 0), shape},
                                         properties_of(t), shape};
    } else {
      item.type = WriteItemType::BYTE_IO;
      item.index = MetadataIndex(fqn);
    }
    plan.items.push_back(std::move(item));
  }
  plan.planner_data = mappings_;
  if (options_.enable_plan_caching) {  // Note [Plan caching]
    pending_local_plan_.reset();
    if (cache_.local_plan && detail::compare_save_plans(plan, *cache_.local_plan)) {
      return unusable_plan();
    }
    pending_local_plan_ = plan;
  }
  return plan;
}

std::pair<std::vector<SavePlan>, Metadata> DefaultSavePlanner::plan_globally(
    std::vector<SavePlan> plans) const {
  plans = detail::dedup_save_plans(std::move(plans), options_.dedup_save_to_lowest_rank);
  return detail::create_default_global_save_plan(std::move(plans));
}

// Note [Plan caching]: Python's enable_plan_caching, with the cache in the planner object
// rather than in class attributes (pass the same DefaultSavePlanner to every save of a rank).
//   create_local_plan (every rank): a plan equal to the last one that reached finish_plan is
//     sent as an empty, unusable plan.
//   create_global_plan (coordinator): with every plan unusable, the cached global plan and
//     Metadata are reused and every rank gets an unusable plan back; otherwise the changed
//     plans replace their cached ones and the global plan is recomputed and sent whole. (Python
//     then sends an unusable plan to each rank whose global plan did not change; that needs a
//     copy of every global plan in the cache, which at 1024 ranks x 2000 tensors costs more
//     than the scatter it saves.) The cache is only updated after the global plan succeeded.
//   finish_plan (every rank): an unusable central plan means "your last final plan's items";
//     its storage_data stays the one the writer gave this save.
// A rank that meets a cached plan without a cache to match (a coordinator with a fresh
// planner, a changed world size) gets an error that says so, never a plan missing that rank's
// items: Python would silently build metadata without them.
std::pair<std::vector<SavePlan>, Metadata> DefaultSavePlanner::create_global_plan(
    std::vector<SavePlan> plans) {
  if (!options_.enable_plan_caching) return plan_globally(std::move(plans));
  std::vector<size_t> unusable;
  for (size_t r = 0; r < plans.size(); ++r) {
    if (!plans[r].usable) unusable.push_back(r);
  }
  const bool hydrated = cache_.metadata.has_value() && cache_.all_plans.size() == plans.size();
  TORCH_CHECK(unusable.empty() || hydrated, "plan caching: rank(s) ", c10::Join(", ", unusable),
              " sent \"unchanged since the last save\" but this coordinator's planner ",
              cache_.metadata ? c10::str("cached a save of ", cache_.all_plans.size(), " ranks")
                              : std::string("has no cached plans"),
              "; pass the same DefaultSavePlanner to every save (SaveOptions::planner) on every "
              "rank, at one world size");
  ++cache_stats_.global_plans;
  if (hydrated && unusable.size() == plans.size()) {
    ++cache_stats_.global_plan_hits;
    return {std::vector<SavePlan>(plans.size(), unusable_plan()), *cache_.metadata};
  }
  std::vector<SavePlan> merged = hydrated ? cache_.all_plans : std::vector<SavePlan>{};
  merged.resize(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    if (plans[r].usable) merged[r] = std::move(plans[r]);
  }
  auto [global, metadata] = plan_globally(merged);
  cache_.all_plans = std::move(merged);
  cache_.metadata = metadata;
  return {std::move(global), std::move(metadata)};
}

SavePlan DefaultSavePlanner::finish_plan(SavePlan central_plan) {
  if (!options_.enable_plan_caching) return central_plan;
  if (!central_plan.usable) {
    TORCH_CHECK(cache_.final_plan.has_value(), "plan caching: the coordinator sent \"your plan ",
                "is unchanged\" but this rank's planner has no cached plan; pass the same ",
                "DefaultSavePlanner to every save (SaveOptions::planner)");
    // The items are the cached ones; storage_data is the writer's for this save (a re-save
    // into a directory that holds a checkpoint gets file names unique to the save).
    std::string storage_data = std::move(central_plan.storage_data);
    central_plan = *cache_.final_plan;
    central_plan.storage_data = std::move(storage_data);
  } else {
    cache_.final_plan = central_plan;
  }
  if (pending_local_plan_) {  // the global plan succeeded: this local plan may now be reused
    cache_.local_plan = std::move(pending_local_plan_);
    pending_local_plan_.reset();
  }
  return central_plan;
}

SavePlan DefaultSavePlanner::unusable_plan() {
  SavePlan plan;
  plan.usable = false;
  return plan;
}

WritePayload DefaultSavePlanner::resolve_data(const WriteItem& item) {
  return transform_object(item, lookup_object(item.index));
}

WritePayload DefaultSavePlanner::lookup_object(const MetadataIndex& index) const {
  auto it = by_fqn_.find(index.fqn);
  TORCH_CHECK(it != by_fqn_.end(), "the plan names '", index.fqn,
              "', which this rank's state dict lacks");
  const Value& value = flat_.items[it->second].second;
  if (value.is_sharded_tensor()) {
    for (const Shard& shard : value.get<ShardedTensor>().local_shards()) {
      if (index.offset && c10::IntArrayRef(shard.offsets) == *index.offset) return shard.tensor;
    }
    TORCH_CHECK(false, "the plan names a shard of '", index.fqn,
                "' that this rank does not hold");
  }
  if (value.is_tensor()) return value.tensor();
  return value;
}

WritePayload DefaultSavePlanner::transform_object(const WriteItem& item, WritePayload object) {
  return object;
}

// ---------------------------------------------------------------------------------------------
// DefaultLoadPlanner

DefaultLoadPlanner::DefaultLoadPlanner(DefaultLoadPlannerOptions options) : options_(options) {}

void DefaultLoadPlanner::set_up_planner(StateDict& state, const Metadata& metadata,
                                        bool is_coordinator) {
  state_ = &state;
  metadata_ = &metadata;
  flat_ = options_.flatten_state_dict ? flatten_state_dict(state) : top_level_items(state);
  by_fqn_ = index_by_fqn(flat_);
}

LoadPlan DefaultLoadPlanner::create_local_plan() {
  TORCH_CHECK(metadata_ != nullptr, "create_local_plan before set_up_planner");
  LoadPlan plan;
  std::vector<std::string> missing;
  for (const auto& [fqn, value] : flat_.items) {
    auto it = metadata_->state_dict_metadata.find(fqn);
    if (it == metadata_->state_dict_metadata.end()) {
      if (!options_.allow_partial_load) missing.push_back(fqn);
      continue;
    }
    if (std::holds_alternative<BytesStorageMetadata>(it->second)) {
      TORCH_CHECK_TYPE(!value.is_tensor() && !value.is_sharded_tensor(), "'", fqn,
                       "' is a non-tensor value in the checkpoint but a tensor in the state "
                       "dict");
      ReadItem r;
      r.type = LoadItemType::BYTE_IO;
      r.dest_index = MetadataIndex(fqn);
      r.storage_index = MetadataIndex(fqn);
      plan.items.push_back(std::move(r));
      continue;
    }
    const auto& saved = std::get<TensorStorageMetadata>(it->second);
    TORCH_CHECK_VALUE(value.is_tensor() || value.is_sharded_tensor(), "'", fqn,
                      "' is a tensor of shape ", shape_string(saved.size),
                      " in the checkpoint but a ", value.type_name(), " in the state dict");
    Dims global_shape;
    c10::ScalarType dtype;
    std::vector<ChunkStorageMetadata> local_chunks;
    if (value.is_sharded_tensor()) {
      const ShardedTensor& st = value.get<ShardedTensor>();
      global_shape = st.global_shape();
      dtype = st.dtype();
      for (const Shard& shard : st.local_shards()) {
        local_chunks.push_back(
            ChunkStorageMetadata{Dims(shard.offsets), Dims(shard.tensor.sizes())});
      }
    } else {
      global_shape = value.tensor().sizes();
      dtype = value.tensor().scalar_type();
      local_chunks.push_back(ChunkStorageMetadata{Dims(global_shape.size(), 0), global_shape});
    }
    TORCH_CHECK_VALUE(global_shape == saved.size, "Size mismatch between saved ",
                      shape_string(saved.size), " and current ", shape_string(global_shape),
                      " for '", fqn, "'");
    TORCH_CHECK_TYPE(options_.allow_dtype_cast || dtype == saved.properties.dtype,
                     "dtype mismatch for '", fqn, "': the checkpoint holds ",
                     dtype_name(saved.properties.dtype), ", the state dict ", dtype_name(dtype),
                     " (set allow_dtype_cast to convert on load)");
    // The saved chunks come from the checkpoint: sound geometry before any read is planned.
    const std::string problem = detail::validate_chunks(fqn, saved, /*require_cover=*/true);
    TORCH_CHECK_VALUE(problem.empty(), "the checkpoint's chunks of ", problem);
    auto reads = detail::create_read_items_for_chunk_list(fqn, saved, local_chunks);
    for (auto& r : reads) plan.items.push_back(std::move(r));
  }
  if (!missing.empty()) {
    std::vector<std::string> saved_keys;
    for (const auto& [k, v] : metadata_->state_dict_metadata) saved_keys.push_back(k);
    std::ostringstream msg;
    msg << "Missing key" << (missing.size() > 1 ? "s" : "") << " in checkpoint state_dict: ";
    const size_t shown = std::min<size_t>(missing.size(), 10);
    for (size_t i = 0; i < shown; ++i) {
      const std::string near = detail::nearest_key(missing[i], saved_keys);
      msg << (i ? ", " : "") << "'" << missing[i] << "'";
      if (!near.empty()) msg << " (did you mean '" << near << "'?)";
    }
    if (shown < missing.size()) msg << " and " << missing.size() - shown << " more";
    msg << ". The checkpoint has " << saved_keys.size()
        << " keys; set allow_partial_load to skip missing keys.";
    TORCH_CHECK(false, msg.str());
  }
  return plan;
}

std::vector<LoadPlan> DefaultLoadPlanner::create_global_plan(std::vector<LoadPlan> plans) {
  return plans;
}

LoadPlan DefaultLoadPlanner::finish_plan(LoadPlan central_plan) { return central_plan; }

void DefaultLoadPlanner::load_bytes(const ReadItem& item, Value value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto path = flat_.mappings.find(item.dest_index.fqn);
  TORCH_CHECK(path != flat_.mappings.end(), "no destination for '", item.dest_index.fqn, "'");
  set_element(*state_, path->second, std::move(value));
}

at::Tensor DefaultLoadPlanner::resolve_tensor(const ReadItem& item) {
  return transform_tensor(item, lookup_tensor(item.dest_index));
}

at::Tensor DefaultLoadPlanner::lookup_tensor(const MetadataIndex& index) const {
  auto it = by_fqn_.find(index.fqn);
  TORCH_CHECK(it != by_fqn_.end(), "no destination for '", index.fqn, "'");
  const Value& value = flat_.items[it->second].second;
  if (value.is_sharded_tensor()) {
    const auto& shards = value.get<ShardedTensor>().local_shards();
    const int64_t i = index.index.value_or(-1);
    TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(shards.size()), "no local shard ", i,
                " of '", index.fqn, "'");
    return writable(shards[i].tensor);
  }
  return writable(value.tensor());
}

at::Tensor DefaultLoadPlanner::transform_tensor(const ReadItem& item, const at::Tensor& tensor) {
  at::Tensor t = tensor;
  for (size_t d = 0; d < item.dest_offsets.size(); ++d) {
    const auto dim = static_cast<int64_t>(d);
    // As Python's narrow_tensor_by_index: a dimension read whole is not narrowed (a view less).
    if (item.dest_offsets[d] == 0 && item.lengths[d] == t.size(dim)) continue;
    t = t.narrow(dim, item.dest_offsets[d], item.lengths[d]);
  }
  return t;
}

void DefaultLoadPlanner::commit_tensor(const ReadItem& item, const at::Tensor& tensor) {}

EmptyStateDictLoadPlanner::EmptyStateDictLoadPlanner(std::vector<std::string> keys)
    : keys_(std::move(keys)) {}

void EmptyStateDictLoadPlanner::set_up_planner(StateDict& state, const Metadata& metadata,
                                               bool is_coordinator) {
  TORCH_CHECK_VALUE(state.empty(), "EmptyStateDictLoadPlanner builds the state dict from the "
                    "checkpoint: pass an empty one");
  auto selected = [&](const std::string& fqn) {
    if (keys_.empty()) return true;
    for (const auto& k : keys_) {
      if (fqn == k || (fqn.size() > k.size() && fqn.compare(0, k.size(), k) == 0 &&
                       fqn[k.size()] == '.')) {
        return true;
      }
    }
    return false;
  };
  for (const auto& [fqn, entry] : metadata.state_dict_metadata) {
    if (!selected(fqn)) continue;
    Value value;  // None, for a value the load replaces
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      value = at::empty(t->size, at::TensorOptions().dtype(t->properties.dtype));
    }
    const ObjectPath* path = nullptr;
    if (metadata.planner_data) {
      auto it = metadata.planner_data->find(fqn);
      if (it != metadata.planner_data->end()) path = &it->second;
    }
    if (path != nullptr) {
      set_element(state, *path, std::move(value));
    } else {
      state[fqn] = std::move(value);
    }
  }
  TORCH_CHECK_VALUE(!state.empty(), "no key of the checkpoint matches ", c10::Join(", ", keys_));
  DefaultLoadPlanner::set_up_planner(state, metadata, is_coordinator);
}

}  // namespace dcp
