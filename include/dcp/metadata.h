// Checkpoint metadata: the types of Python's torch.distributed.checkpoint.metadata, with the same
// names and fields. dcp::save returns a Metadata; the coordinator pickles it into '.metadata'
// exactly as Python DCP does (docs/format.md), and dcp::load reads it back.
//
// Thread-safety: plain data.
#pragma once

#include <c10/core/Layout.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "dcp/dims.h"
#include "dcp/flat_map.h"
#include "dcp/object_path.h"
#include "dcp/ordered_map.h"

namespace dcp {

/// One saved box of a tensor: global element offsets and sizes per dimension.
struct ChunkStorageMetadata {
  Dims offsets;
  Dims sizes;
  bool operator==(const ChunkStorageMetadata& o) const {
    return offsets == o.offsets && sizes == o.sizes;
  }
};

/// Python's _MEM_FORMAT_ENCODING.
enum class MemFormatEncoding : int64_t {
  TORCH_CONTIGUOUS_FORMAT = 0,
  TORCH_CHANNELS_LAST = 1,
  TORCH_PRESERVE_FORMAT = 2,
};

/// Properties of a saved tensor. Only `dtype` matters on load.
struct TensorProperties {
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Layout layout = c10::Layout::Strided;
  bool requires_grad = false;
  MemFormatEncoding memory_format = MemFormatEncoding::TORCH_CONTIGUOUS_FORMAT;
  bool pin_memory = false;
  bool operator==(const TensorProperties& o) const {
    return dtype == o.dtype && layout == o.layout && requires_grad == o.requires_grad &&
           memory_format == o.memory_format && pin_memory == o.pin_memory;
  }
};

/// A tensor's entry in Metadata.state_dict_metadata: global shape and the saved chunks.
struct TensorStorageMetadata {
  TensorProperties properties;
  Dims size;
  std::vector<ChunkStorageMetadata> chunks;
  bool operator==(const TensorStorageMetadata& o) const {
    return properties == o.properties && size == o.size && chunks == o.chunks;
  }
};

/// A non-tensor value's entry in Metadata.state_dict_metadata.
struct BytesStorageMetadata {
  bool operator==(const BytesStorageMetadata&) const { return true; }
};

using StorageMetadata = std::variant<TensorStorageMetadata, BytesStorageMetadata>;

/// Names one item of a checkpoint: a chunk of a tensor (fqn plus the chunk's global offsets)
/// or a byte item (fqn, no offset). As in Python, equality and ordering ignore `index`, which
/// is only a hint: the chunk's position in TensorStorageMetadata.chunks.
struct MetadataIndex {
  std::string fqn;
  std::optional<Dims> offset;
  std::optional<int64_t> index;

  MetadataIndex() = default;
  explicit MetadataIndex(std::string fqn, std::optional<Dims> offset = std::nullopt,
                         std::optional<int64_t> index = std::nullopt)
      : fqn(std::move(fqn)), offset(std::move(offset)), index(index) {}
  // A Dims matches this one exactly; without it, the optional<Dims> and IntArrayRef
  // constructors would be equally good conversions, and the call ambiguous.
  MetadataIndex(std::string fqn, Dims offset, std::optional<int64_t> index = std::nullopt)
      : fqn(std::move(fqn)), offset(std::move(offset)), index(index) {}
  /// From a std::vector or a tensor's sizes().
  MetadataIndex(std::string fqn, c10::IntArrayRef offset,
                std::optional<int64_t> index = std::nullopt)
      : fqn(std::move(fqn)), offset(Dims(offset)), index(index) {}

  bool operator==(const MetadataIndex& o) const { return fqn == o.fqn && offset == o.offset; }
  bool operator!=(const MetadataIndex& o) const { return !(*this == o); }
  bool operator<(const MetadataIndex& o) const {
    return fqn != o.fqn ? fqn < o.fqn : offset < o.offset;
  }
};
std::ostream& operator<<(std::ostream& os, const MetadataIndex& index);

/// Python's StorageMeta: where and by which save a checkpoint was written.
struct StorageMeta {
  std::optional<std::string> checkpoint_id;
  std::optional<std::string> save_id;
  std::optional<std::string> load_id;
  std::vector<std::string> modules;
  bool operator==(const StorageMeta& o) const {
    return checkpoint_id == o.checkpoint_id && save_id == o.save_id && load_id == o.load_id &&
           modules == o.modules;
  }
};

/// Python's filesystem `_StorageInfo`: where one item's bytes live.
struct StorageInfo {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
  std::vector<std::string> transform_descriptors;
  bool operator==(const StorageInfo& o) const {
    return relative_path == o.relative_path && offset == o.offset && length == o.length &&
           transform_descriptors == o.transform_descriptors;
  }
};

/// Metadata.storage_data: item -> location, in key order, in one array (dcp::FlatMap: no heap
/// block per entry). Inserting out of key order moves the entries behind; a StorageReader
/// that builds millions of entries in another order collects them and calls
/// StorageData::from_unsorted.
using StorageData = FlatMap<MetadataIndex, StorageInfo>;

/// The version string this library writes, as Python's CURRENT_DCP_VERSION.
inline constexpr const char* kDcpVersion = "1.0.0";

/// The contents of '.metadata'.
struct Metadata {
  /// Flat key -> tensor or bytes metadata, in Python's order: the order in which the global plan
  /// first meets each key (rank 0's items first, in its state dict's order, then each later
  /// rank's new keys), and for a loaded checkpoint the order of its '.metadata'.
  OrderedMap<std::string, StorageMetadata> state_dict_metadata;
  /// The default planner's data: flat key -> original nested path. nullopt when the
  /// checkpoint's planner data is absent or not of that form.
  std::optional<std::map<std::string, ObjectPath>> planner_data;
  /// Storage's data: item -> location.
  StorageData storage_data;
  std::optional<StorageMeta> storage_meta;
  std::optional<std::string> version;

  bool operator==(const Metadata& o) const;
};

/// The Python name of a dtype ("float32", "bfloat16", ...).
std::string dtype_name(c10::ScalarType dtype);

}  // namespace dcp
