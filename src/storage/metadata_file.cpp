// Reading and writing '.metadata' (see metadata_file.h).
#include "storage/metadata_file.h"

#include <c10/util/Exception.h>

#include <fcntl.h>

#include <map>
#include <optional>
#include <string_view>

#include "format/arena.h"
#include "format/metadata_checksum.h"
#include "format/metadata_codec.h"
#include "io/file.h"
#include "storage_data.h"
#include "storage/file_output.h"
#include "storage/paths.h"
#include "util/crc32.h"

namespace dcp::detail {

// Note [Rank-local metadata]: Python's save(..., use_collectives=False) has every rank plan
// alone and write "__{rank}.metadata" describing only what that rank wrote (its data files keep
// the prefix "__{rank}_"); Python's load then reads only its own rank's file, so it needs the
// same world size. dcp merges every rank's file into the metadata of the whole checkpoint
// (tensors: the union of their chunks; an item that several ranks wrote, such as a replicated
// tensor or a byte item, is read from the lowest rank's copy), so such a checkpoint loads at
// any world size, resharded like any other.
Metadata merge_rank_local_metadata(const std::vector<std::pair<std::string, Metadata>>& parts) {
  Metadata out;
  std::map<std::string, std::string> first_file;  // key -> the file that described it first
  for (const auto& [file, md] : parts) {
    for (const auto& [key, entry] : md.state_dict_metadata) {
      auto [it, inserted] = out.state_dict_metadata.emplace(key, entry);
      if (inserted) {
        first_file.emplace(key, file);
        continue;
      }
      const auto* mine = std::get_if<TensorStorageMetadata>(&entry);
      auto* merged = std::get_if<TensorStorageMetadata>(&it->second);
      TORCH_CHECK((mine == nullptr) == (merged == nullptr), "rank-local metadata '", file,
                  "' stores '", key, "' as ", mine ? "a tensor" : "bytes", " but '",
                  first_file.at(key), "' as ", mine ? "bytes" : "a tensor");
      if (mine == nullptr) continue;  // the same byte item, written by several ranks
      TORCH_CHECK(mine->properties.dtype == merged->properties.dtype && mine->size == merged->size,
                  "rank-local metadata '", file, "' describes '", key, "' as ",
                  dtype_name(mine->properties.dtype), " ", c10::IntArrayRef(mine->size), " but '",
                  first_file.at(key), "' as ", dtype_name(merged->properties.dtype), " ",
                  c10::IntArrayRef(merged->size));
      for (const auto& chunk : mine->chunks) {
        bool known = false;
        for (const auto& have : merged->chunks) {
          if (have.offsets != chunk.offsets) continue;
          TORCH_CHECK(have.sizes == chunk.sizes, "rank-local metadata '", file,
                      "' has a chunk of '", key, "' at ", c10::IntArrayRef(chunk.offsets),
                      " of sizes ", c10::IntArrayRef(chunk.sizes), " where '", first_file.at(key),
                      "' has sizes ", c10::IntArrayRef(have.sizes));
          known = true;
        }
        if (!known) merged->chunks.push_back(chunk);
      }
    }
    if (md.planner_data) {
      if (!out.planner_data) out.planner_data.emplace();
      for (const auto& [key, path] : *md.planner_data) out.planner_data->emplace(key, path);
    }
    if (!out.storage_meta) out.storage_meta = md.storage_meta;
    if (!out.version) out.version = md.version;
  }
  // An item in several files is read from the first file's copy; make_storage_data keeps the
  // last of equal keys, so the files go in backwards.
  std::vector<std::pair<MetadataIndex, StorageInfo>> storage;
  for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
    storage.insert(storage.end(), part->second.storage_data.begin(),
                   part->second.storage_data.end());
  }
  out.storage_data = detail::make_storage_data(std::move(storage));
  return out;
}

namespace {

// A '.metadata' file's bytes, in memory first touched as huge pages where the kernel gives them
// (format/arena.h): at scale the file is 200 MiB and more, 50,000 faults in 4 KiB pages.
struct MetadataBytes {
  Arena arena;
  std::string_view bytes;
};
MetadataBytes read_metadata_bytes(const std::string& path) {
  const File f = File::open(path, O_RDONLY);
  const uint64_t size = f.size();
  TORCH_CHECK(size <= kMaxMetadataBytes, "'", path, "' holds ", size, " bytes, more than the ",
              kMaxMetadataBytes, " a '.metadata' can have");
  MetadataBytes out;
  char* data = static_cast<char*>(out.arena.allocate(size, 1));
  f.pread_all(data, size, 0);
  out.bytes = std::string_view(data, size);
  return out;
}

}  // namespace

MetadataFile read_metadata_file(const std::string& dir, bool check_checksum) {
  TORCH_CHECK(!dir.empty(), "FileSystemReader: no checkpoint path (pass a checkpoint_id)");
  const std::string file = join_path(dir, paths::metadata_file());
  if (!path_exists(file)) {
    TORCH_CHECK(is_directory(dir), "no checkpoint at '", dir, "': the directory does not exist");
    std::map<int, std::string> rank_files;
    for (const auto& name : list_directory(dir)) {
      if (const auto rank = paths::parse_rank_metadata_file(name)) rank_files.emplace(*rank, name);
    }
    if (!rank_files.empty()) {  // a save without collectives
      std::vector<std::pair<std::string, Metadata>> parts;
      for (const auto& [rank, name] : rank_files) {
        const std::string path = join_path(dir, name);
        const MetadataBytes read = read_metadata_bytes(path);
        parts.emplace_back(path,
                           decode_metadata(read.bytes.data(), read.bytes.size(), "'" + path + "'"));
      }
      MetadataFile out;
      out.metadata = merge_rank_local_metadata(parts);
      out.checksum = check_checksum ? MetadataFile::Checksum::kAbsent
                                    : MetadataFile::Checksum::kUnchecked;
      out.rank_local_files = static_cast<int>(parts.size());
      return out;
    }
    bool has_data = false;
    for (const auto& name : list_directory(dir)) has_data = has_data || paths::is_data_file(name);
    TORCH_CHECK(!has_data, "no checkpoint at '", dir, "': data files are there but '",
                paths::metadata_file(),
                "' is not, so the save that wrote them did not finish (incomplete checkpoint)");
    TORCH_CHECK(false, "no checkpoint at '", dir, "': '", paths::metadata_file(), "' not found");
  }
  const MetadataBytes read = read_metadata_bytes(file);
  const std::string_view bytes = read.bytes;
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

MetadataChecksum write_metadata_file(const std::string& path, const Metadata& metadata,
                                     const MetadataWriteOptions& options) {
  try {
    constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
    MetadataChecksum written;
    if (metadata.storage_meta && metadata.storage_meta->save_id) {
      written.save_id = *metadata.storage_meta->save_id;
    }
    std::optional<File> file;
    if (options.direct_io) file = File::open_direct(path, kFlags);
    std::optional<DirectFileOutput> direct;  // destroyed first: waits for a write in flight
    if (file) direct.emplace(*file);
    else file = File::open(path, kFlags);
    encode_metadata(metadata, [&](std::string_view piece) {
      // Checksummed while the piece is still in cache from the encoder.
      written.crc32 = crc32(piece.data(), piece.size(), written.crc32);
      written.size += piece.size();
      if (direct) direct->write(piece.data(), piece.size());
      else file->write_all(piece.data(), piece.size());
    });
    if (direct) direct->finish();
    if (options.sync) file->sync();
    file->close();
    return written;
  } catch (...) {
    remove_file_quietly(path);  // the write's own error is the one to report
    throw;
  }
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
