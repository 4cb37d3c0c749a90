// Reading '.metadata' (see metadata_file.h).
#include "storage/metadata_file.h"

#include <c10/util/Exception.h>

#include "format/metadata_checksum.h"
#include "format/metadata_codec.h"
#include "io/file.h"
#include "storage/paths.h"

namespace dcp::detail {

MetadataFile read_metadata_file(const std::string& dir, bool check_checksum) {
  TORCH_CHECK(!dir.empty(), "FileSystemReader: no checkpoint path (pass a checkpoint_id)");
  const std::string file = join_path(dir, paths::metadata_file());
  if (!path_exists(file)) {
    TORCH_CHECK(is_directory(dir), "no checkpoint at '", dir, "': the directory does not exist");
    bool has_data = false;
    for (const auto& name : list_directory(dir)) has_data = has_data || paths::is_data_file(name);
    TORCH_CHECK(!has_data, "no checkpoint at '", dir, "': data files are there but '",
                paths::metadata_file(),
                "' is not, so the save that wrote them did not finish (incomplete checkpoint)");
    TORCH_CHECK(false, "no checkpoint at '", dir, "': '", paths::metadata_file(), "' not found");
  }
  const std::string bytes = read_file(file, kMaxMetadataBytes);
  MetadataFile out;
  out.metadata = decode_metadata(bytes.data(), bytes.size(), "'" + file + "'");
  if (!check_checksum) return out;
  const std::string sidecar = join_path(dir, paths::metadata_checksum_file());
  if (!path_exists(sidecar)) {
    out.checksum = MetadataFile::Checksum::kAbsent;
    return out;
  }
  const MetadataChecksum checksum =
      decode_metadata_checksum(read_file(sidecar, kMaxMetadataChecksumBytes), "'" + sidecar + "'");
  const auto& meta = out.metadata.storage_meta;
  switch (check_metadata_checksum(bytes, meta ? meta->save_id : std::nullopt, checksum)) {
    case ChecksumVerdict::kMatch:
      out.checksum = MetadataFile::Checksum::kVerified;
      break;
    case ChecksumVerdict::kStale:
      out.checksum = MetadataFile::Checksum::kStale;
      break;
    case ChecksumVerdict::kCorrupt:
      TORCH_CHECK(false, "corrupt checkpoint metadata '", file, "': its ", bytes.size(),
                  " bytes do not match the size and CRC-32 that '", paths::metadata_checksum_file(),
                  "' records for save ", checksum.save_id, " (", checksum.size,
                  " bytes); the file changed after that save committed it");
  }
  return out;
}

const char* checksum_name(MetadataFile::Checksum checksum) {
  switch (checksum) {
    case MetadataFile::Checksum::kUnchecked:
      return "unchecked";
    case MetadataFile::Checksum::kAbsent:
      return "absent";
    case MetadataFile::Checksum::kVerified:
      return "verified";
    case MetadataFile::Checksum::kStale:
      return "stale";
  }
  return "?";
}

}  // namespace dcp::detail
