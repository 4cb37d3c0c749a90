// What both '.metadata' decoders (the object tree's, format/metadata_codec.cpp, and the direct
// one, format/metadata_direct.cpp) agree on: the modules of the dataclasses docs/format.md §2
// names, and the limits they apply to what a file may ask of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dcp::detail::metadata_schema {

inline constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
inline constexpr const char* kLegacyMetadataModule =
    "torch.distributed._shard.sharded_tensor.metadata";
inline constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// Note [Expansion budget] (format/torch_save.cpp): the pickle memo lets a small file refer to
// one large torch.Size or string from many places; each copy a decoder makes is charged
// (kStrCharge plus the bytes of a string, 8 per dimension plus 8 of a shape), and decoding stops
// at kExpansionPerByte bytes per input byte plus kExpansionSlack. Both decoders charge the same
// values at the same places, so they agree on what is too much.
inline constexpr uint64_t kExpansionPerByte = 64;
inline constexpr uint64_t kExpansionSlack = uint64_t{8} << 20;
inline constexpr uint64_t kStrCharge = 32;
inline constexpr uint64_t budget_for(size_t input_bytes) {
  return kExpansionSlack + kExpansionPerByte * input_bytes;
}
inline constexpr uint64_t shape_charge(size_t dims) { return 8 * (dims + 1); }

// At most this many dimensions per tensor (PyTorch's own kernels stop at 25).
inline constexpr size_t kMaxDims = 64;

// StorageMeta's checkpoint id as Python saves a pathlib path: REDUCE of a class of one of these
// modules with the path's parts, which become one string joined with '/'.
inline bool is_pathlib_module(std::string_view module) {
  return module == "pathlib" || module == "pathlib._local";
}
inline void append_path_part(std::string& path, std::string_view part) {
  if (!path.empty() && path.back() != '/') path += '/';
  path += part;
}

}  // namespace dcp::detail::metadata_schema
