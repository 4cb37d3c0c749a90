// ZipWriter (see zip_writer.h).
//
// Note [The zip writer]: what PyTorchStreamWriter (miniz under MZ_ZIP_FLAG_WRITE_ZIP64, stored
// records, no timestamps) writes for an archive below 4 GiB, byte for byte:
//   per record, in write order: a local header [PK\3\4, version needed 0, flags 0x0808 (data
//   descriptor, UTF-8), method 0, time 0, date 0, CRC-32 0, sizes 0, name length, extra
//   length], the name "archive/<name>", the extra field "FB" <le16 n> and n 'Z's that puts the
//   data at a multiple of 64 (PyTorchStreamWriter's getPadding), the data, then a data
//   descriptor [PK\7\8, CRC-32, size, size] (4-byte fields). An empty record has flags
//   0x0800 (no descriptor) and no data descriptor;
//   at the end, the records "version" ("3\n", kMinProducedFileFormatVersion, where none was
//   written) and ".data/serialization_id": 20 decimal digits of the hash_combine over the
//   record names (c10::hash, in the iteration order of an unordered_set<string> fed the names
//   in write order, as PyTorchStreamWriter keeps them) and 20 of the hash_combine of every
//   data descriptor's CRC-32 in write order (PyTorchStreamWriter reads each CRC-32 back from
//   any write that begins with PK\7\8, so also from record data beginning with those bytes);
//   then the central directory [PK\1\2, made by 0, needed 0, the flags, method 0, time 0,
//   date 0, CRC-32, sizes, name length, no extra, no comment, disk 0, attributes 0, local
//   header offset] and name per record, the zip64 end record [PK\6\6, 44, made by 0x031e,
//   needed 0x2d, disks 0, entries, entries, directory size, offset], its locator [PK\6\7, 0,
//   offset, 1 disk] and the end record [PK\5\6, 0, 0, entries, entries, size, offset, no
//   comment]. ZipWriterTest.BytesEqualPyTorchStreamWriters compares the two writers.
#include "format/zip_writer.h"

#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include <cstring>
#include <iomanip>
#include <sstream>

#include "format/zip_layout.h"
#include "util/crc32.h"

namespace dcp::detail {
namespace {

constexpr const char* kFolder = "archive/";
constexpr uint64_t kAlignment = 64;  // PyTorchStreamWriter's kFieldAlignment
// Well below 4 GiB, where miniz starts writing zip64 fields into records.
constexpr uint64_t kMaxArchive = uint64_t{0xF0000000};

// UTF-8 names (0x0800), and a data descriptor (0x0008) after any data.
uint64_t flags(uint64_t size) { return size == 0 ? 0x0800 : 0x0808; }

// v as n little-endian bytes (bytes past the 8th are zeros).
void le(std::string& out, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) {
    out.push_back(k < 8 ? static_cast<char>((v >> (8 * k)) & 0xFF) : '\0');
  }
}

}  // namespace

bool ZipWriter::fits(uint64_t bytes, uint64_t records) {
  // Each record adds at most a header, padding, a descriptor and a directory entry.
  constexpr uint64_t kPerRecord = zip::kLocalHeaderSize + 4 + kAlignment +
                                  zip::kDataDescriptorSize + zip::kCentralEntrySize +
                                  2 * 64;  // two copies of a name up to 64
  constexpr uint64_t kMaxRecords = 0xFFFF - 2;           // the end record's 16-bit counts
  return records <= kMaxRecords && bytes <= kMaxArchive &&
         records * kPerRecord <= kMaxArchive - bytes;
}

void ZipWriter::put(const void* data, size_t n) {
  if (n == 0) return;
  sink_(data, n);
  offset_ += n;
}

void ZipWriter::write_record(const std::string& name, const void* data, size_t size) {
  const std::string full = kFolder + name;
  TORCH_CHECK(written_.insert(name).second, "zip record ", name, " written twice");
  TORCH_CHECK(offset_ + size <= kMaxArchive && full.size() <= 0xFFFF,
              "ZipWriter: record ", name, " does not fit (ZipWriter::fits)");
  const uint64_t start = offset_ + zip::kLocalHeaderSize + full.size() + 4;
  const uint64_t padding = (kAlignment - start % kAlignment) % kAlignment;
  scratch_.clear();
  le(scratch_, zip::kLocalHeader, 4);
  le(scratch_, 0, 2);       // version needed
  le(scratch_, flags(size), 2);
  le(scratch_, 0, 2);  // stored
  le(scratch_, 0, 4);       // time, date
  le(scratch_, 0, 12);      // CRC-32 and sizes: in the descriptor
  le(scratch_, full.size(), 2);
  le(scratch_, padding + 4, 2);
  scratch_ += full;
  scratch_ += "FB";
  le(scratch_, padding, 2);
  scratch_.append(padding, 'Z');
  const auto local_header = static_cast<uint32_t>(offset_);
  put(scratch_.data(), scratch_.size());
  if (size == 0) {  // no data, no descriptor
    entries_.push_back(Entry{full, 0, 0, local_header});
    return;
  }
  put(data, size);
  const uint32_t crc = crc32(data, size);
  if (size >= 8) {  // Note [The zip writer]: a write that begins with PK\7\8
    uint32_t head;
    std::memcpy(&head, data, 4);
    if (head == zip::kDataDescriptor) {
      uint32_t folded;
      std::memcpy(&folded, static_cast<const char*>(data) + 4, 4);
      combined_crc32_ = c10::hash_combine(combined_crc32_, folded);
    }
  }
  scratch_.clear();
  le(scratch_, zip::kDataDescriptor, 4);
  le(scratch_, crc, 4);
  le(scratch_, size, 4);
  le(scratch_, size, 4);
  put(scratch_.data(), scratch_.size());
  combined_crc32_ = c10::hash_combine(combined_crc32_, crc);
  entries_.push_back(Entry{full, crc, static_cast<uint32_t>(size), local_header});
}

uint64_t ZipWriter::finish() {
  if (written_.count(".data/version") == 0 && written_.count("version") == 0) {
    write_record("version", "3\n", 2);  // kMinProducedFileFormatVersion
  }
  TORCH_CHECK(written_.count("byteorder") == 1, "ZipWriter: no byteorder record");
  uint64_t names = 0;
  for (const std::string& name : written_) {
    names = c10::hash_combine(names, c10::hash<std::string>{}(name));
  }
  std::ostringstream id;
  id << std::setfill('0') << std::setw(20) << names << std::setfill('0') << std::setw(20)
     << combined_crc32_;
  const std::string serialization_id = id.str();
  write_record(".data/serialization_id", serialization_id.data(), serialization_id.size());

  const uint64_t directory = offset_;
  scratch_.clear();
  for (const Entry& e : entries_) {
    le(scratch_, zip::kCentralEntry, 4);
    le(scratch_, 0, 4);       // made by, needed
    le(scratch_, flags(e.size), 2);
    le(scratch_, 0, 6);  // method, time, date
    le(scratch_, e.crc32, 4);
    le(scratch_, e.size, 4);
    le(scratch_, e.size, 4);
    le(scratch_, e.name.size(), 2);
    le(scratch_, 0, 8);  // extra and comment lengths, disk, internal attributes
    le(scratch_, 0, 4);  // external attributes
    le(scratch_, e.local_header, 4);
    scratch_ += e.name;
  }
  const uint64_t directory_size = scratch_.size();
  const uint64_t end64 = directory + directory_size;
  le(scratch_, zip::kEndOfDirectory64, 4);
  le(scratch_, 44, 8);
  le(scratch_, 0x031e, 2);
  le(scratch_, 0x2d, 2);
  le(scratch_, 0, 8);  // disks
  le(scratch_, entries_.size(), 8);
  le(scratch_, entries_.size(), 8);
  le(scratch_, directory_size, 8);
  le(scratch_, directory, 8);
  le(scratch_, zip::kEndLocator64, 4);
  le(scratch_, 0, 4);
  le(scratch_, end64, 8);
  le(scratch_, 1, 4);
  le(scratch_, zip::kEndOfDirectory, 4);
  le(scratch_, 0, 4);  // disks
  le(scratch_, entries_.size(), 2);
  le(scratch_, entries_.size(), 2);
  le(scratch_, directory_size, 4);
  le(scratch_, directory, 4);
  le(scratch_, 0, 2);  // comment
  put(scratch_.data(), scratch_.size());
  return offset_;
}

}  // namespace dcp::detail
