// The zip writer of torch.save archives: writes the bytes LibTorch's PyTorchStreamWriter writes
// (docs/format.md §3; Note [The zip writer] in zip_writer.cpp), with the CRC-32 computed by
// util/crc32 (ISA-L) instead of miniz's, which ran at 1.7 GB/s and was the save path's cost per
// byte. Archives that would need zip64 fields in their records (a record or an offset at 4 GiB)
// are left to PyTorchStreamWriter: fits() says which.
//
// Thread-safety: none; one writer per archive.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "format/torch_save.h"

namespace dcp::detail {

class ZipWriter {
 public:
  /// Whether an archive of `records` records holding `bytes` bytes in all (data and names)
  /// stays well below the offsets and sizes at which PyTorchStreamWriter writes zip64 fields
  /// into its records; only then does ZipWriter write the same bytes.
  static bool fits(uint64_t bytes, uint64_t records);

  /// Writes to `sink`, whose exceptions propagate (the archive is then abandoned).
  explicit ZipWriter(const ByteSink& sink) : sink_(sink) {}

  /// Appends the record "archive/<name>", stored, its data aligned to 64 bytes.
  void write_record(const std::string& name, const void* data, size_t size);

  /// Writes the records PyTorchStreamWriter::writeEndOfFile adds (version, serialization id)
  /// and the central directory with its zip64 end records. Returns the archive's size.
  uint64_t finish();

 private:
  struct Entry {
    std::string name;  // with the archive's folder
    uint32_t crc32;
    uint32_t size;
    uint32_t local_header;
  };
  void put(const void* data, size_t n);

  const ByteSink& sink_;
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
  std::string scratch_;  // headers and padding
  // As PyTorchStreamWriter's files_written_ and combined_uncomp_crc32_: both enter the
  // serialization id, the set through its iteration order.
  std::unordered_set<std::string> written_;
  size_t combined_crc32_ = 0;
};

}  // namespace dcp::detail
