// read_zip_directory (see zip_directory.h).
//
// Note [Declared sizes]: a record's zip directory entry declares its size, and
// PyTorchStreamReader::getRecord allocates that many bytes before it reads any: a 2 KB item
// declaring a 4 GiB data.pkl cost a 4 GiB allocation. A record cannot be larger than the item
// holding it, so before LibTorch sees the archive this walk bounds every declared size:
//   1. the end-of-central-directory record (EOCD, signature PK\5\6) is found in the last
//      64 KiB + 22 bytes; where a zip64 locator (PK\6\7) precedes it, the zip64 EOCD
//      (PK\6\6) it points to gives the directory's offset, size and entry count: miniz's rule
//      (mz_zip_reader_read_central_dir), which PyTorchStreamReader follows. The EOCD's own
//      fields must then agree with it or read 0xFFFF/0xFFFFFFFF: a walk that read the 32-bit
//      fields where miniz reads the zip64 ones checked another directory than LibTorch then
//      used (a fuzz finding, tests/fuzz/regressions/record). A field at 0xFFFF/0xFFFFFFFF
//      without a locator is refused;
//   2. the directory lies inside the archive and holds that many entries (PK\1\2);
//   3. each entry is stored (method 0, as PyTorchStreamWriter writes), with equal compressed
//      and uncompressed sizes (zip64 extra field 0x0001 where they are 0xFFFFFFFF), and its
//      data lies inside the archive.
#include "format/zip_directory.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "format/zip_layout.h"
#include "util/crc32.h"

namespace dcp::detail {
namespace {

using zip::kCentralEntry;
using zip::kCentralEntrySize;
using zip::kDataDescriptor;
using zip::kDataDescriptorFlag;
using zip::kEndLocator64;
using zip::kEndLocator64Size;
using zip::kEndOfDirectory;
using zip::kEndOfDirectory64;
using zip::kEndOfDirectory64Size;
using zip::kEndOfDirectorySize;
using zip::kLocalHeader;
using zip::kLocalHeaderSize;
using zip::kMaxComment;

uint64_t le(const char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(p[k]);
  return v;
}

class Walk {
 public:
  explicit Walk(const ArchiveSource& source) : source_(source), size_(source.size()) {}

  void run() {
    // The bytes the zip reader reads first (RecordGeometry::kZipTailRead), which the read
    // hints announce; only an archive with a long zip comment needs the wider search.
    uint64_t tail_size = std::min<uint64_t>(size_, RecordGeometry::kZipTailRead);
    std::string tail = read(size_ - tail_size, tail_size);
    size_t at = find_eocd(tail);
    const uint64_t widest = std::min<uint64_t>(size_, kEndOfDirectorySize + kMaxComment);
    if (at == std::string::npos && tail_size < widest) {
      tail_size = widest;
      tail = read(size_ - tail_size, tail_size);
      at = find_eocd(tail);
    }
    check(at != std::string::npos, "no end of zip directory");
    const char* e = tail.data() + at;
    const uint64_t eocd_pos = size_ - tail_size + at;
    const uint64_t entries32 = le(e + 10, 2), cd_size32 = le(e + 12, 4),
                   cd_offset32 = le(e + 16, 4);
    uint64_t entries = entries32, cd_size = cd_size32, cd_offset = cd_offset32;
    // As miniz: a locator is looked for only where the zip64 EOCD and it fit before the EOCD.
    std::string locator;
    if (eocd_pos >= kEndLocator64Size + kEndOfDirectory64Size) {
      locator = read(eocd_pos - kEndLocator64Size, kEndLocator64Size);
      if (le(locator.data(), 4) != kEndLocator64) locator.clear();
    }
    check(!locator.empty() || (entries != 0xFFFF && cd_size != 0xFFFFFFFF &&
                               cd_offset != 0xFFFFFFFF),
          "zip64 directory locator missing");
    if (!locator.empty()) {
      const uint64_t eocd64_pos = le(locator.data() + 8, 8);
      check(eocd64_pos <= size_ && kEndOfDirectory64Size <= size_ - eocd64_pos,
            "zip64 directory record outside the archive");
      const std::string r = read(eocd64_pos, kEndOfDirectory64Size);
      check(le(r.data(), 4) == kEndOfDirectory64, "zip64 directory record missing");
      entries = le(r.data() + 32, 8);
      cd_size = le(r.data() + 40, 8);
      cd_offset = le(r.data() + 48, 8);
      check((entries32 == 0xFFFF || entries32 == entries) &&
                (cd_size32 == 0xFFFFFFFF || cd_size32 == cd_size) &&
                (cd_offset32 == 0xFFFFFFFF || cd_offset32 == cd_offset),
            "the end of the zip directory (", entries32, " entries, [", cd_offset32, ", +",
            cd_size32, ")) disagrees with its zip64 record (", entries, " entries, [", cd_offset,
            ", +", cd_size, "))");
    }
    check(cd_offset <= size_ && cd_size <= size_ - cd_offset, "the zip directory [", cd_offset,
          ", +", cd_size, ") lies outside the archive of ", size_, " bytes");
    check(entries <= cd_size / kCentralEntrySize, "the zip directory claims ", entries,
          " entries in ", cd_size, " bytes");
    const std::string cd = read(cd_offset, cd_size);
    size_t pos = 0;
    for (uint64_t i = 0; i < entries; ++i) pos = entry(cd, pos);
  }

  std::vector<ZipEntry> entries;

 private:
  // The last EOCD signature in `tail` that leaves room for the record, or npos.
  static size_t find_eocd(const std::string& tail) {
    const size_t n = tail.size();
    for (size_t k = n >= kEndOfDirectorySize ? n - kEndOfDirectorySize + 1 : 0; k-- > 0;) {
      if (le(tail.data() + k, 4) == kEndOfDirectory) return k;
    }
    return std::string::npos;
  }

  // Checks the entry at `pos` of the directory; returns where the next one starts.
  size_t entry(const std::string& cd, size_t pos) {
    check(cd.size() - pos >= kCentralEntrySize && le(cd.data() + pos, 4) == kCentralEntry,
          "malformed zip directory entry at directory byte ", pos);
    const char* p = cd.data() + pos;
    const uint64_t method = le(p + 10, 2), name_len = le(p + 28, 2), extra_len = le(p + 30, 2),
                   comment_len = le(p + 32, 2);
    uint64_t comp = le(p + 20, 4), uncomp = le(p + 24, 4), local = le(p + 42, 4);
    const auto crc = static_cast<uint32_t>(le(p + 16, 4));
    check(cd.size() - pos - kCentralEntrySize >= name_len + extra_len + comment_len,
          "zip directory entry at directory byte ", pos, " runs past the directory");
    const std::string name(p + kCentralEntrySize, name_len);
    // zip64 extra field: the 8-byte values of the fields that read 0xFFFFFFFF, in order.
    const char* extra = p + kCentralEntrySize + name_len;
    for (uint64_t x = 0; x + 4 <= extra_len;) {
      const uint64_t id = le(extra + x, 2), len = le(extra + x + 2, 2);
      check(x + 4 + len <= extra_len, "record '", name, "': malformed zip extra field");
      if (id == 0x0001) {
        uint64_t y = x + 4;
        for (uint64_t* field : {&uncomp, &comp, &local}) {
          if (*field != 0xFFFFFFFF) continue;
          check(y + 8 <= x + 4 + len, "record '", name, "': short zip64 field");
          *field = le(extra + y, 8);
          y += 8;
        }
      }
      x += 4 + len;
    }
    check(method == 0, "record '", name, "' is compressed (method ", method,
          "); torch.save records are stored");
    check(comp == uncomp, "record '", name, "' declares ", uncomp, " bytes stored in ", comp);
    check(uncomp <= size_, "record '", name, "' declares ", uncomp,
          " bytes, more than the item's ", size_);
    check(local <= size_ && kLocalHeaderSize + name_len <= size_ - local &&
              uncomp <= size_ - local - kLocalHeaderSize - name_len,
          "record '", name, "' at archive byte ", local, " with ", uncomp,
          " bytes lies outside the item's ", size_);
    entries.push_back(ZipEntry{name, uncomp, crc, local});
    return pos + kCentralEntrySize + name_len + extra_len + comment_len;
  }

  std::string read(uint64_t offset, uint64_t n) const {
    std::string out(n, '\0');
    if (n > 0) source_.read(offset, out.data(), n);
    return out;
  }

  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    TORCH_CHECK(cond, "corrupt item ", source_.describe(), ": ", c10::str(args...));
  }

  const ArchiveSource& source_;
  const uint64_t size_;
};

// A record's local header (its fixed part) and where its data begins, checked to lie inside
// the item.
struct LocalHeader {
  char bytes[kLocalHeaderSize];
  uint64_t data;
};

LocalHeader read_local_header(const ArchiveSource& source, const ZipEntry& e) {
  // read_zip_directory checked that the header's fixed part and the name fit.
  LocalHeader h;
  source.read(e.local_header, h.bytes, kLocalHeaderSize);
  TORCH_CHECK(le(h.bytes, 4) == kLocalHeader, "corrupt item ", source.describe(), ": record '",
              e.name, "' has no local header at archive byte ", e.local_header);
  h.data = e.local_header + kLocalHeaderSize + le(h.bytes + 26, 2) + le(h.bytes + 28, 2);
  TORCH_CHECK(h.data <= source.size() && e.size <= source.size() - h.data, "corrupt item ",
              source.describe(), ": record '", e.name, "' at archive byte ", h.data, " with ",
              e.size, " bytes runs past the item's ", source.size());
  return h;
}

}  // namespace

uint64_t zip_record_data_offset(const ArchiveSource& source, const ZipEntry& e) {
  return read_local_header(source, e).data;
}

void check_zip_records(const ArchiveSource& source) {
  auto check = [&](bool cond, const ZipEntry& e, const auto&... args) {
    TORCH_CHECK(cond, "corrupt item ", source.describe(), ": record '", e.name, "' ",
                c10::str(args...));
  };
  for (const ZipEntry& e : read_zip_directory(source)) {
    const LocalHeader local = read_local_header(source, e);
    const char* header = local.bytes;
    const uint64_t data = local.data;
    const uint64_t name_len = le(header + 26, 2);
    std::string name(name_len, '\0');
    check(name_len == e.name.size(), e, "is named differently in its local header");
    source.read(e.local_header + kLocalHeaderSize, name.data(), name_len);
    check(name == e.name, e, "is named '", name, "' in its local header");
    const uint64_t flags = le(header + 6, 2), method = le(header + 8, 2),
                   crc = le(header + 14, 4), comp = le(header + 18, 4),
                   uncomp = le(header + 22, 4);
    check(method == 0, e, "is compressed in its local header");
    if ((flags & kDataDescriptorFlag) == 0) {
      // Sizes read 0xFFFFFFFF where a zip64 extra field holds them.
      check((comp == 0xFFFFFFFF || comp == e.size) && (uncomp == 0xFFFFFFFF || uncomp == e.size),
            e, "has other sizes in its local header (", comp, ", ", uncomp,
            ") than its directory entry (", e.size, ")");
      check(crc == e.crc32, e, "has another CRC-32 in its local header");
    } else {
      // What PyTorchStreamWriter writes: zeros in the header, then after the data a
      // descriptor [PK\7\8] crc32 size size, with 4-byte sizes (8-byte ones in zip64).
      check(crc == 0 && comp == 0 && uncomp == 0, e, "has a data descriptor, but its local "
            "header's CRC-32 and sizes are not zero");
      const uint64_t at = data + e.size;
      std::string d(std::min<uint64_t>(24, source.size() - at), '\0');
      if (!d.empty()) source.read(at, d.data(), d.size());
      const size_t sig = d.size() >= 4 && le(d.data(), 4) == kDataDescriptor ? 4 : 0;
      const bool short_sizes = d.size() >= sig + 12 && le(d.data() + sig + 4, 4) == e.size &&
                               le(d.data() + sig + 8, 4) == e.size;
      const bool long_sizes = d.size() >= sig + 20 && le(d.data() + sig + 4, 8) == e.size &&
                              le(d.data() + sig + 12, 8) == e.size;
      check(d.size() >= sig + 4 && le(d.data() + sig, 4) == e.crc32 && (short_sizes || long_sizes),
            e, "has a data descriptor at archive byte ", at, " that does not match its directory "
            "entry");
    }
    // In pieces: a record can be gigabytes.
    constexpr uint64_t kPiece = 4 << 20;
    std::string buffer(std::min(e.size, kPiece), '\0');
    uint32_t computed = 0;
    for (uint64_t at = 0; at < e.size; at += kPiece) {
      const uint64_t n = std::min(kPiece, e.size - at);
      source.read(data + at, buffer.data(), n);
      computed = crc32(buffer.data(), n, computed);
    }
    check(computed == e.crc32, e, "at archive bytes [", data, ", ", data + e.size,
          ") fails its CRC-32 check");
  }
}

std::vector<ZipEntry> read_zip_directory(const ArchiveSource& source) {
  Walk walk(source);
  walk.run();
  return std::move(walk.entries);
}

}  // namespace dcp::detail
