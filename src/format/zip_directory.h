// Checks a torch.save archive's zip central directory before LibTorch opens it (Note [Declared
// sizes] in zip_directory.cpp): every size and offset the directory declares must fit inside
// the archive, because PyTorchStreamReader allocates a record's declared size before reading it
// (its constructor already reads the 'version' record).
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

/// Reads every record of the archive and checks it against its directory entry: the local
/// header's signature, name, sizes and CRC-32 field, and the CRC-32 of the record's bytes
/// (data.pkl, the tensor data, the version and serialization id records alike). Throws
/// c10::Error naming the archive and record at the first mismatch. For dcp::verify; loads
/// check only what they decode.
void check_zip_records(const ArchiveSource& source);

}  // namespace dcp::detail
