// Plan, write-result and metadata encoding (see plan_codec.h).
#include "protocol/plan_codec.h"

#include <string_view>

#include "util/wire.h"

namespace dcp::detail {
namespace {

// Note [Repeated names]: an index's fqn is mostly the fqn written just before it: a storage
// entry of the committed Metadata follows the entry of the same tensor's previous chunk (the
// map is sorted by fqn, and a tensor saved on n ranks has n chunks), and a read item's
// storage_index names the tensor its dest_index names. There the name goes as a count of 0
// ("the same as `prev`"); any other name as its length + 1, then its bytes. At 1024 ranks x
// 2,000 tensors this leaves out 2 million names of the Metadata broadcast. A decoder without a
// previous name refuses the 0.
template <class W>
void put_fqn(W& w, const std::string& fqn, const std::string* prev) {
  if (prev != nullptr && fqn == *prev) {
    w.count(0);
  } else {
    w.count(fqn.size() + 1);
    w.raw(fqn);
  }
}

// Returns whether the name was a repeat of `prev`.
bool get_fqn(wire::Reader& r, std::string& fqn, const std::string* prev) {
  const size_t n = r.count();
  if (n == 0) {
    TORCH_CHECK(prev != nullptr, "wire: a repeated name with no name before it");
    fqn = *prev;
    return true;
  }
  r.str_into(fqn, n - 1);
  return false;
}

// `prev`: the fqn of the index written before this one where its name is likely repeated
// (Note [Repeated names]), else null.
template <class W>
void put_index(W& w, const MetadataIndex& index, const std::string* prev = nullptr) {
  put_fqn(w, index.fqn, prev);
  w.u8(index.offset.has_value());
  if (index.offset) w.ints(*index.offset);
  w.u8(index.index.has_value());
  if (index.index) w.varint(*index.index);
}

// Returns whether the fqn was a repeat of `prev`.
bool get_index(wire::Reader& r, MetadataIndex& index, const std::string* prev = nullptr) {
  const bool repeated = get_fqn(r, index.fqn, prev);
  if (r.u8()) r.ints_into(index.offset.emplace());
  if (r.u8()) index.index = r.varint();
  return repeated;
}

template <class W>
void put_path(W& w, const ObjectPath& path) {
  w.count(path.size());
  for (const Key& k : path) {
    if (const auto* s = std::get_if<std::string>(&k)) {
      w.u8(0);
      w.str(*s);
    } else {
      w.u8(1);
      w.varint(std::get<int64_t>(k));
    }
  }
}

ObjectPath get_path(wire::Reader& r) {
  ObjectPath path(r.count(/*min_bytes_each=*/2));
  for (Key& k : path) {
    if (r.u8() == 0) k = r.str();
    else k = r.varint();
  }
  return path;
}

template <class W>
void put_properties(W& w, const TensorProperties& p) {
  w.varint(static_cast<int64_t>(p.dtype));
  w.varint(static_cast<int64_t>(p.layout));
  w.u8(p.requires_grad);
  w.varint(static_cast<int64_t>(p.memory_format));
  w.u8(p.pin_memory);
}

void get_properties(wire::Reader& r, TensorProperties& p) {
  p.dtype = static_cast<c10::ScalarType>(r.varint());
  p.layout = static_cast<c10::Layout>(r.varint());
  p.requires_grad = r.u8();
  p.memory_format = static_cast<MemFormatEncoding>(r.varint());
  p.pin_memory = r.u8();
}

template <class W>
void put_storage_info(W& w, const StorageInfo& info) {
  w.str(info.relative_path);
  w.varint(info.offset);
  w.varint(info.length);
  w.strs(info.transform_descriptors);
}

void get_storage_info(wire::Reader& r, StorageInfo& info) {
  r.str_into(info.relative_path);
  info.offset = r.varint();
  info.length = r.varint();
  info.transform_descriptors = r.strs();
}

StorageInfo get_storage_info(wire::Reader& r) {
  StorageInfo info;
  get_storage_info(r, info);
  return info;
}

template <class W>
void put_optional(W& w, const std::optional<std::string>& v) {
  w.u8(v.has_value());
  if (v) w.str(*v);
}

std::optional<std::string> get_optional(wire::Reader& r) {
  if (r.u8() == 0) return std::nullopt;
  return r.str();
}

}  // namespace

namespace {

// Note [Shared planner_data]: the default planners put every rank's mappings (flat key ->
// ObjectPath) in its plan, and the ranks of one model have the same ones: at 1024 ranks x
// 2,000 tensors, 2 million map entries (about 400 MiB, half of the plans' decoding time) that
// the global plan merges back into 2,000. So dcp::save's coordinator decodes the plans with
// decode_save_plans, where a plan whose planner_data bytes equal the previous plan's shares
// that plan's map (a memcmp of about 100 KB per rank here); the global plan merges a shared
// map once; and encode_save_plans copies the bytes of a map shared with the previous plan
// instead of encoding it again. PlannerData copies a shared map before any change, so a
// planner that changes one rank's planner_data changes only that rank's.

// The planner_data of the plan encoded last, and its bytes.
struct LastEncodedPlannerData {
  const PlannerData* data = nullptr;
  std::string bytes;
};

// The planner_data of the plan decoded last, and its bytes in that plan's message.
struct LastPlannerData {
  std::string_view bytes;
  PlannerData data;
};

std::string encode_save_plan(const SavePlan& plan, LastEncodedPlannerData* last) {
  wire::Writer w;
  w.count(plan.items.size());
  for (const auto& item : plan.items) {
    put_index(w, item.index);
    w.u8(static_cast<uint8_t>(item.type));
    w.u8(item.tensor_data.has_value());
    if (item.tensor_data) {
      const auto& t = *item.tensor_data;
      w.ints(t.chunk.offsets);
      w.ints(t.chunk.sizes);
      put_properties(w, t.properties);
      w.ints(t.size);
    }
  }
  w.str(plan.storage_data);
  if (last != nullptr && last->data != nullptr && plan.planner_data.shares_with(*last->data)) {
    w.raw(last->bytes);
  } else {
    const size_t start = w.size();
    w.count(plan.planner_data.size());
    for (const auto& [fqn, path] : plan.planner_data) {
      w.str(fqn);
      put_path(w, path);
    }
    if (last != nullptr) *last = {&plan.planner_data, std::string(w.view(start))};
  }
  w.u8(plan.usable);
  return w.take();
}

SavePlan decode_save_plan(const std::string& bytes, LastPlannerData* last) {
  wire::Reader r(bytes);
  SavePlan plan;
  const size_t items = r.count(/*min_bytes_each=*/5);
  plan.items.reserve(items);
  for (size_t i = 0; i < items; ++i) {  // each item built in place
    WriteItem& item = plan.items.emplace_back();
    get_index(r, item.index);
    item.type = static_cast<WriteItemType>(r.u8());
    if (r.u8()) {
      TensorWriteData& t = item.tensor_data.emplace();
      r.ints_into(t.chunk.offsets);
      r.ints_into(t.chunk.sizes);
      get_properties(r, t.properties);
      r.ints_into(t.size);
    }
  }
  plan.storage_data = r.str();
  const size_t start = r.position();
  if (last != nullptr && !last->bytes.empty() && r.skip_if_next(last->bytes)) {
    plan.planner_data = last->data;
  } else {
    PlannerData::Map map;
    const size_t n = r.count();
    for (size_t i = 0; i < n; ++i) {
      std::string fqn = r.str();  // written in the map's order: each entry goes at the end
      map.emplace_hint(map.end(), std::move(fqn), get_path(r));
    }
    plan.planner_data = std::move(map);
    if (last != nullptr) *last = {r.view(start), plan.planner_data};
  }
  plan.usable = r.u8();
  TORCH_CHECK(r.done(), "wire: trailing bytes after a SavePlan");
  return plan;
}

}  // namespace

std::string encode_save_plan(const SavePlan& plan) { return encode_save_plan(plan, nullptr); }

std::vector<std::string> encode_save_plans(const std::vector<SavePlan>& plans) {
  std::vector<std::string> out;
  out.reserve(plans.size());
  LastEncodedPlannerData last;
  for (const SavePlan& plan : plans) out.push_back(encode_save_plan(plan, &last));
  return out;
}

SavePlan decode_save_plan(const std::string& bytes) { return decode_save_plan(bytes, nullptr); }

std::vector<SavePlan> decode_save_plans(const std::vector<std::string>& encoded) {
  std::vector<SavePlan> plans;
  plans.reserve(encoded.size());
  LastPlannerData last;
  for (const std::string& bytes : encoded) plans.push_back(decode_save_plan(bytes, &last));
  return plans;
}

namespace {

void put_read_item(wire::Writer& w, const ReadItem& item) {
  w.u8(static_cast<uint8_t>(item.type));
  put_index(w, item.dest_index);
  w.ints(item.dest_offsets);
  put_index(w, item.storage_index, &item.dest_index.fqn);
  w.ints(item.storage_offsets);
  w.ints(item.lengths);
}

void get_read_item(wire::Reader& r, ReadItem& item) {
  const uint8_t type = r.u8();
  TORCH_CHECK(type <= static_cast<uint8_t>(LoadItemType::BYTE_IO), "wire: read item type ", int(type));
  item.type = static_cast<LoadItemType>(type);
  get_index(r, item.dest_index);
  r.ints_into(item.dest_offsets);
  get_index(r, item.storage_index, &item.dest_index.fqn);
  r.ints_into(item.storage_offsets);
  r.ints_into(item.lengths);
}

void put_load_plan(wire::Writer& w, const LoadPlan& plan) {
  w.count(plan.items.size());
  for (const auto& item : plan.items) put_read_item(w, item);
  w.str(plan.storage_data);
}

LoadPlan get_load_plan(wire::Reader& r) {
  LoadPlan plan;
  const size_t items = r.count(/*min_bytes_each=*/10);
  plan.items.reserve(items);
  for (size_t i = 0; i < items; ++i) get_read_item(r, plan.items.emplace_back());
  plan.storage_data = r.str();
  return plan;
}

}  // namespace

std::string encode_load_plan(const LoadPlan& plan) {
  wire::Writer w;
  put_load_plan(w, plan);
  return w.take();
}

LoadPlan decode_load_plan(const std::string& bytes) {
  wire::Reader r(bytes);
  LoadPlan plan = get_load_plan(r);
  TORCH_CHECK(r.done(), "wire: trailing bytes after a LoadPlan");
  return plan;
}

std::string encode_load_plan(const LoadPlan& plan, const std::vector<SharedRead>& shared) {
  wire::Writer w;
  put_load_plan(w, plan);
  w.count(shared.size());
  for (const auto& s : shared) {
    w.varint(s.root);
    w.varint(s.nbytes);
    w.varint(static_cast<int64_t>(s.dtype));
    put_read_item(w, s.item);
  }
  return w.take();
}

std::pair<LoadPlan, std::vector<SharedRead>> decode_load_plan_with_shared(const std::string& bytes) {
  wire::Reader r(bytes);
  LoadPlan plan = get_load_plan(r);
  std::vector<SharedRead> shared(r.count(/*min_bytes_each=*/13));
  for (auto& s : shared) {
    s.root = static_cast<int>(r.varint());
    s.nbytes = r.varint();
    s.dtype = static_cast<c10::ScalarType>(r.varint());
    get_read_item(r, s.item);
  }
  TORCH_CHECK(r.done(), "wire: trailing bytes after a LoadPlan");
  return {std::move(plan), std::move(shared)};
}

std::string encode_write_results(const std::vector<WriteResult>& results) {
  wire::Writer w;
  w.count(results.size());
  for (const auto& res : results) {
    put_index(w, res.index);
    w.varint(res.size_in_bytes);
    put_storage_info(w, res.storage_data);
  }
  return w.take();
}

std::vector<WriteResult> decode_write_results(const std::string& bytes) {
  wire::Reader r(bytes);
  std::vector<WriteResult> results;
  const size_t n = r.count(/*min_bytes_each=*/8);
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    WriteResult& res = results.emplace_back();
    get_index(r, res.index);
    res.size_in_bytes = r.varint();
    get_storage_info(r, res.storage_data);
  }
  TORCH_CHECK(r.done(), "wire: trailing bytes after write results");
  return results;
}

namespace {

// Field by field, in the order of the Metadata struct; every map in its own iteration order,
// so the decoder appends (state_dict_metadata) or inserts at the end (the sorted maps).
template <class W>
void put_metadata_message(W& w, const Metadata& metadata) {
  w.count(metadata.state_dict_metadata.size());
  for (const auto& [fqn, entry] : metadata.state_dict_metadata) {
    w.str(fqn);
    const auto* tensor = std::get_if<TensorStorageMetadata>(&entry);
    w.u8(tensor != nullptr);
    if (tensor == nullptr) continue;
    put_properties(w, tensor->properties);
    w.ints(tensor->size);
    w.count(tensor->chunks.size());
    for (const auto& chunk : tensor->chunks) {
      w.ints(chunk.offsets);
      w.ints(chunk.sizes);
    }
  }
  w.u8(metadata.planner_data.has_value());
  if (metadata.planner_data) {
    w.count(metadata.planner_data->size());
    for (const auto& [fqn, path] : *metadata.planner_data) {
      w.str(fqn);
      put_path(w, path);
    }
  }
  w.count(metadata.storage_data.size());
  const std::string* prev = nullptr;
  for (const auto& [index, info] : metadata.storage_data) {
    put_index(w, index, prev);
    put_storage_info(w, info);
    prev = &index.fqn;
  }
  w.u8(metadata.storage_meta.has_value());
  if (metadata.storage_meta) {
    put_optional(w, metadata.storage_meta->checkpoint_id);
    put_optional(w, metadata.storage_meta->save_id);
    put_optional(w, metadata.storage_meta->load_id);
    w.strs(metadata.storage_meta->modules);
  }
  put_optional(w, metadata.version);
}

}  // namespace

size_t metadata_message_size(const Metadata& metadata) {
  wire::Sizer sizer;
  put_metadata_message(sizer, metadata);
  return sizer.size();
}

std::string encode_metadata_message(const Metadata& metadata) {
  wire::Writer w;
  w.reserve(metadata_message_size(metadata));
  put_metadata_message(w, metadata);
  return w.take();
}

Metadata decode_metadata_message(const std::string& bytes) {
  wire::Reader r(bytes);
  Metadata metadata;
  const size_t entries = r.count();
  for (size_t i = 0; i < entries; ++i) {
    std::string fqn = r.str();
    if (r.u8() == 0) {
      metadata.state_dict_metadata.try_emplace(std::move(fqn), BytesStorageMetadata{});
      continue;
    }
    TensorStorageMetadata tensor;
    get_properties(r, tensor.properties);
    r.ints_into(tensor.size);
    tensor.chunks.resize(r.count(/*min_bytes_each=*/2));
    for (auto& chunk : tensor.chunks) {
      r.ints_into(chunk.offsets);
      r.ints_into(chunk.sizes);
    }
    metadata.state_dict_metadata.try_emplace(std::move(fqn), std::move(tensor));
  }
  if (r.u8()) {
    auto& planner_data = metadata.planner_data.emplace();
    const size_t n = r.count();
    for (size_t i = 0; i < n; ++i) {
      std::string fqn = r.str();
      planner_data.emplace_hint(planner_data.end(), std::move(fqn), get_path(r));
    }
  }
  // An entry takes at least 7 bytes: three counts, two flags, offset and length.
  const size_t items = r.count(/*min_bytes_each=*/7);
  metadata.storage_data.reserve(items);
  // The previous name as a copy, not a pointer into the map: a corrupt message's entries out
  // of order would move the map's keys.
  std::string prev;
  for (size_t i = 0; i < items; ++i) {
    MetadataIndex index;
    if (!get_index(r, index, i > 0 ? &prev : nullptr)) prev = index.fqn;
    metadata.storage_data.emplace_hint(metadata.storage_data.end(), std::move(index),
                                       get_storage_info(r));
  }
  if (r.u8()) {
    StorageMeta& meta = metadata.storage_meta.emplace();
    meta.checkpoint_id = get_optional(r);
    meta.save_id = get_optional(r);
    meta.load_id = get_optional(r);
    meta.modules = r.strs();
  }
  metadata.version = get_optional(r);
  TORCH_CHECK(r.done(), "wire: trailing bytes after a Metadata");
  return metadata;
}

}  // namespace dcp::detail
