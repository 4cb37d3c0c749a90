// The '.metadata' checksum sidecar ('.metadata.checksum', Note [Metadata checksum]): the size
// and CRC-32 of the '.metadata' a dcp save committed, and that save's id. Python DCP neither
// reads nor writes it, so interop is untouched; a checkpoint without it (written by Python) is
// checked by parsing and validation alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dcp::detail {

struct MetadataChecksum {
  uint64_t size = 0;    // of '.metadata', in bytes
  uint32_t crc32 = 0;   // of '.metadata'
  std::string save_id;  // storage_meta.save_id of the save that wrote both
};

/// The sidecar's text: "dcp-metadata-checksum 1 size=<n> crc32=<8 hex> save_id=<id>\n".
std::string encode_metadata_checksum(const MetadataChecksum& checksum);

/// The most bytes a sidecar can hold.
constexpr uint64_t kMaxMetadataChecksumBytes = 512;

/// Parses a sidecar. Throws c10::Error naming `source` when it is not one (corrupt).
MetadataChecksum decode_metadata_checksum(const std::string& text, const std::string& source);

enum class ChecksumVerdict {
  kMatch,    // '.metadata' is the one the checksum describes, byte for byte
  kCorrupt,  // it is that save's '.metadata' (it holds the save id), but its bytes differ
  kStale,    // it was written by another save (Python re-saved into the directory, say)
};

/// Compares '.metadata' (its bytes, and the save id it declares, if any) with a sidecar.
ChecksumVerdict check_metadata_checksum(std::string_view metadata_bytes,
                                        const std::optional<std::string>& metadata_save_id,
                                        const MetadataChecksum& checksum);

}  // namespace dcp::detail
