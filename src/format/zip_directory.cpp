// read_zip_directory (see zip_directory.h).
//
// Note [Declared sizes]: a record's zip directory entry declares its size, and
// PyTorchStreamReader::getRecord allocates that many bytes before it reads any: a 2 KB item
// declaring a 4 GiB data.pkl cost a 4 GiB allocation. A record cannot be larger than the item
// holding it, so before LibTorch sees the archive this walk bounds every declared size:
//   1. the end-of-central-directory record (EOCD, signature PK\5\6) is found in the last
//      64 KiB + 22 bytes; with zip64 (a field at 0xFFFF/0xFFFFFFFF) its locator (PK\6\7) and
//      the zip64 EOCD (PK\6\6) give the directory's offset, size and entry count;
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

namespace dcp::detail {
namespace {

constexpr uint32_t kEocd = 0x06054b50, kEocd64 = 0x06064b50, kLocator64 = 0x07064b50,
                   kEntry = 0x02014b50;
constexpr size_t kEocdSize = 22, kLocatorSize = 20, kEocd64Size = 56, kEntrySize = 46,
                 kLocalHeaderSize = 30, kMaxComment = 0xFFFF;

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
    if (at == std::string::npos && tail_size < std::min<uint64_t>(size_, kEocdSize + kMaxComment)) {
      tail_size = std::min<uint64_t>(size_, kEocdSize + kMaxComment);
      tail = read(size_ - tail_size, tail_size);
      at = find_eocd(tail);
    }
    check(at != std::string::npos, "no end of zip directory");
    const char* e = tail.data() + at;
    const uint64_t eocd_pos = size_ - tail_size + at;
    uint64_t entries = le(e + 10, 2), cd_size = le(e + 12, 4), cd_offset = le(e + 16, 4);
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
      check(eocd_pos >= kLocatorSize, "zip64 directory locator missing");
      const std::string locator = read(eocd_pos - kLocatorSize, kLocatorSize);
      check(le(locator.data(), 4) == kLocator64, "zip64 directory locator missing");
      const uint64_t eocd64_pos = le(locator.data() + 8, 8);
      check(eocd64_pos <= size_ && kEocd64Size <= size_ - eocd64_pos,
            "zip64 directory record outside the archive");
      const std::string r = read(eocd64_pos, kEocd64Size);
      check(le(r.data(), 4) == kEocd64, "zip64 directory record missing");
      entries = le(r.data() + 32, 8);
      cd_size = le(r.data() + 40, 8);
      cd_offset = le(r.data() + 48, 8);
    }
    check(cd_offset <= size_ && cd_size <= size_ - cd_offset, "the zip directory [", cd_offset,
          ", +", cd_size, ") lies outside the archive of ", size_, " bytes");
    check(entries <= cd_size / kEntrySize, "the zip directory claims ", entries,
          " entries in ", cd_size, " bytes");
    const std::string cd = read(cd_offset, cd_size);
    size_t pos = 0;
    for (uint64_t i = 0; i < entries; ++i) pos = entry(cd, pos);
  }

  std::vector<ZipEntry> entries;

 private:
  // The last EOCD signature in `tail` that leaves room for the record, or npos.
  static size_t find_eocd(const std::string& tail) {
    for (size_t k = tail.size() >= kEocdSize ? tail.size() - kEocdSize + 1 : 0; k-- > 0;) {
      if (le(tail.data() + k, 4) == kEocd) return k;
    }
    return std::string::npos;
  }

  // Checks the entry at `pos` of the directory; returns where the next one starts.
  size_t entry(const std::string& cd, size_t pos) {
    check(cd.size() - pos >= kEntrySize && le(cd.data() + pos, 4) == kEntry,
          "malformed zip directory entry at directory byte ", pos);
    const char* p = cd.data() + pos;
    const uint64_t method = le(p + 10, 2), name_len = le(p + 28, 2), extra_len = le(p + 30, 2),
                   comment_len = le(p + 32, 2);
    uint64_t comp = le(p + 20, 4), uncomp = le(p + 24, 4), local = le(p + 42, 4);
    const auto crc = static_cast<uint32_t>(le(p + 16, 4));
    check(cd.size() - pos - kEntrySize >= name_len + extra_len + comment_len,
          "zip directory entry at directory byte ", pos, " runs past the directory");
    const std::string name(p + kEntrySize, name_len);
    // zip64 extra field: the 8-byte values of the fields that read 0xFFFFFFFF, in order.
    const char* extra = p + kEntrySize + name_len;
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
    entries.push_back(ZipEntry{name, uncomp, crc});
    return pos + kEntrySize + name_len + extra_len + comment_len;
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

}  // namespace

std::vector<ZipEntry> read_zip_directory(const ArchiveSource& source) {
  Walk walk(source);
  walk.run();
  return std::move(walk.entries);
}

}  // namespace dcp::detail
