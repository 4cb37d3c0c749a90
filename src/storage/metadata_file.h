// A checkpoint directory's '.metadata' file. Reading: the "no checkpoint" and "incomplete
// checkpoint" diagnoses, the bounded read, decoding, and the checksum sidecar's verdict (Note
// [Metadata checksum] in format/metadata_checksum.cpp); FileSystemReader and dcp::verify use
// it. Writing: the encoding streamed into the file, for FileSystemWriter's commit.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcp/metadata.h"
#include "format/metadata_checksum.h"

namespace dcp::detail {

struct MetadataFile {
  enum class Checksum {
    kUnchecked,  // not asked to check it
    kAbsent,     // no sidecar: written by Python DCP (or by a save without a save id)
    kVerified,   // the sidecar matches, byte for byte
    kStale,      // the sidecar belongs to another save: '.metadata' is checked by parsing only
  };
  Metadata metadata;
  Checksum checksum = Checksum::kUnchecked;
  /// How many rank-local "__{rank}.metadata" files were merged (Note [Rank-local metadata]);
  /// 0 for a checkpoint with one '.metadata'.
  int rank_local_files = 0;
};

/// The largest '.metadata' read (1 GiB: tens of millions of entries; Python's own pickle.load
/// would need several times that in objects).
constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;

/// Reads and decodes `dir`/.metadata; with `check_checksum`, compares it with its sidecar.
/// Without '.metadata', merges the rank-local "__{rank}.metadata" files of a save without
/// collectives, if there are any (Note [Rank-local metadata]). Throws c10::Error when there is
/// no checkpoint, when it does not decode, when rank-local files contradict each other, and
/// when the sidecar shows it corrupt (naming both files).
MetadataFile read_metadata_file(const std::string& dir, bool check_checksum);

struct MetadataWriteOptions {
  bool sync = true;  // fsync the file before returning
  /// Write through DirectFileOutput (O_DIRECT, queued: the disk writes 4 MiB buffers in order
  /// while the encoder fills the next), as FileSystemWriterOptions::direct_io does for
  /// data files; buffered where the file system refuses O_DIRECT.
  bool direct_io = false;
};

/// Encodes `metadata` straight into a new file at `path` (created, or truncated), computing
/// its size and CRC-32 as the bytes go: the pickle is never whole in memory. Returns what its
/// checksum sidecar records: that size and CRC-32, and the save id of `metadata.storage_meta`
/// (empty without one). It renames nothing; the caller commits. On failure it removes the
/// file and rethrows.
MetadataChecksum write_metadata_file(const std::string& path, const Metadata& metadata,
                                     const MetadataWriteOptions& options);

/// Merges the metadata of a save without collectives, one part per rank (ascending), into the
/// metadata of the whole checkpoint. Throws naming the key and both files on a contradiction.
Metadata merge_rank_local_metadata(const std::vector<std::pair<std::string, Metadata>>& parts);

/// "verified", "absent", ...: for reports.
const char* checksum_name(MetadataFile::Checksum checksum);

}  // namespace dcp::detail
