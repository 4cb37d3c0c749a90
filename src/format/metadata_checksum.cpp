// The '.metadata' checksum sidecar (see metadata_checksum.h).
//
// Note [Metadata checksum]: every record of a data file carries CRC-32s, but '.metadata' is a
// bare pickle, and a flipped byte inside a number (a chunk offset, a storage offset or length)
// still parses and may still validate. So the coordinator writes, just before it commits
// '.metadata', a sidecar with that file's size and CRC-32 and the save's id (which '.metadata'
// also holds, in storage_meta). Readers compare:
//   - size and CRC-32 equal: the bytes are what the save wrote;
//   - otherwise, when '.metadata' holds the sidecar's save id anywhere in its bytes (a flip
//     can make the decoder skip storage_meta: unknown fields are ignored, as Python does), or
//     declares one within kMaxIdFlips differing bytes of it (a flip inside the id): corrupt;
//   - otherwise the sidecar is stale: another writer (Python DCP, which does not know the
//     sidecar, or a save that died between the sidecar's rename and the commit) replaced
//     '.metadata', and only parsing and validation check it. Two save ids are random UUIDs;
//     they differ in almost every position, never in only a few.
// The sidecar is written before '.metadata' is renamed into place, so a crash between the two
// leaves a stale sidecar beside the previous checkpoint's '.metadata', never a wrong verdict.
#include "format/metadata_checksum.h"

#include <c10/util/Exception.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "util/crc32.h"

namespace dcp::detail {
namespace {

constexpr const char kMagic[] = "dcp-metadata-checksum 1 ";
constexpr size_t kMaxIdFlips = 4;
constexpr size_t kMaxSaveId = 256;

bool same_save(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  return differing <= kMaxIdFlips;
}

// "size=<n> crc32=<8 hex> save_id=": the canonical form of the numbers.
std::string fields(uint64_t size, uint32_t crc) {
  char out[64];
  std::snprintf(out, sizeof(out), "size=%" PRIu64 " crc32=%08" PRIx32 " save_id=", size, crc);
  return out;
}

}  // namespace

std::string encode_metadata_checksum(const MetadataChecksum& checksum) {
  return kMagic + fields(checksum.size, checksum.crc32) + checksum.save_id + "\n";
}

MetadataChecksum decode_metadata_checksum(const std::string& text, const std::string& source) {
  const size_t magic = std::strlen(kMagic);
  auto fail = [&]() {
    TORCH_CHECK(false, "corrupt checksum file ", source, ": expected '", kMagic,
                "size=<n> crc32=<hex> save_id=<id>'");
  };
  if (text.empty() || text.size() > magic + 64 + kMaxSaveId ||
      text.compare(0, magic, kMagic) != 0 || text.back() != '\n') {
    fail();
  }
  const std::string line = text.substr(magic, text.size() - magic - 1);
  MetadataChecksum out;
  unsigned long long size = 0;
  unsigned int crc = 0;
  int id_at = -1;
  // %n records where save_id starts; the numbers must be exactly where the format puts them.
  if (std::sscanf(line.c_str(), "size=%20llu crc32=%8x save_id=%n", &size, &crc, &id_at) != 2 ||
      id_at < 0) {
    fail();
  }
  out.size = size;
  out.crc32 = crc;
  out.save_id = line.substr(static_cast<size_t>(id_at));
  // The canonical form only: a flip that still scans (a digit into a space, say) is corrupt.
  if (line != fields(out.size, out.crc32) + out.save_id || out.save_id.empty() ||
      out.save_id.find_first_of(std::string(" \n\0", 3)) != std::string::npos) {
    fail();
  }
  return out;
}

ChecksumVerdict check_metadata_checksum(std::string_view metadata_bytes,
                                        const std::optional<std::string>& metadata_save_id,
                                        const MetadataChecksum& checksum) {
  if (metadata_bytes.size() == checksum.size &&
      crc32(metadata_bytes.data(), metadata_bytes.size()) == checksum.crc32) {
    return ChecksumVerdict::kMatch;
  }
  if (metadata_bytes.find(checksum.save_id) != std::string::npos ||
      (metadata_save_id && same_save(*metadata_save_id, checksum.save_id))) {
    return ChecksumVerdict::kCorrupt;
  }
  return ChecksumVerdict::kStale;
}

}  // namespace dcp::detail
