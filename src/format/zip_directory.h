// The zip layer of torch.save archives, for reading: the central directory, checked (Note
// [Declared sizes] in zip_directory.cpp: every size and offset it declares must fit inside the
// archive, since a reader allocates a record's declared size before reading it), where each
// record's bytes start, and the whole-archive check dcp::verify runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/torch_save.h"

namespace dcp::detail {

/// One record of the archive, as its directory entry declares it.
struct ZipEntry {
  std::string name;  // "archive/data.pkl", "archive/data/0", ...
  uint64_t size = 0;
  uint32_t crc32 = 0;
  uint64_t local_header = 0;  // archive offset of its local header
};

/// The archive's records. Throws c10::Error naming the archive and the record unless the
/// archive ends with a zip directory (plain or zip64) whose entries are stored (uncompressed,
/// as torch.save writes them), each within the archive. Reads only the directory; time and
/// memory are linear in its size, which is bounded by the archive's.
std::vector<ZipEntry> read_zip_directory(const ArchiveSource& source);

/// Where the bytes of `entry` (from read_zip_directory(source)) start: after its local header,
/// whose name and extra fields are skipped (LibTorch's getRecordOffset). Throws c10::Error
/// naming the archive and record unless the header's signature is there and the record's
/// bytes lie inside the archive.
uint64_t zip_record_data_offset(const ArchiveSource& source, const ZipEntry& entry);

/// Reads every record of the archive and checks it against its directory entry: the local
/// header's signature, name, sizes and CRC-32 field, and the CRC-32 of the record's bytes
/// (data.pkl, the tensor data, the version and serialization id records alike). Throws
/// c10::Error naming the archive and record at the first mismatch. For dcp::verify; loads
/// check only what they decode.
void check_zip_records(const ArchiveSource& source);

}  // namespace dcp::detail
