// A small binary encoding for what ranks exchange during a save or load: plans, write
// results, outcomes. Counts, lengths and integer fields are varints (LEB128; signed values
// zigzag-encoded first, as protobuf's sint64), so a plan item's offsets, sizes and properties
// take a byte or two each instead of eight: at 1024 ranks x 2,000 tensors the final plans the
// coordinator scatters shrink from 435 MiB to 173 MiB, the committed Metadata it broadcasts
// from 302 MiB to 112 MiB (docs/performance.md, "Varints on the wire"). i64() stays
// fixed-width for messages whose size must be known in advance (DistWrapper's outcome
// size). Only processes of the same build read it, so it carries no version.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/dims.h"

namespace dcp::detail::wire {

/// The most bytes a 64-bit varint takes.
inline constexpr size_t kMaxVarint = 10;

inline uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t u) {
  return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
}
/// Writes `v` as LEB128 at `out` (room for kMaxVarint bytes); returns the bytes written.
inline size_t put_uvarint(char* out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<char>(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<char>(v);
  return n;
}
inline size_t uvarint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

class Writer {
 public:
  void reserve(size_t n) { out_.reserve(n); }
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void i64(int64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out_.append(b, 8);
  }
  /// An unsigned varint: a count or a length.
  void count(size_t n) {
    char b[kMaxVarint];
    out_.append(b, put_uvarint(b, n));
  }
  /// A signed varint (zigzag): small values of either sign take one byte.
  void varint(int64_t v) {
    char b[kMaxVarint];
    out_.append(b, put_uvarint(b, zigzag(v)));
  }
  void str(const std::string& s) {
    count(s.size());
    out_.append(s);
  }
  void ints(c10::IntArrayRef v) {
    // At most 1 + 4 x 10 bytes for a tensor of up to four dimensions: encoded on the stack
    // and appended once. The plain `count(); for (x) varint(x);` appends once per value:
    // encoding the final plans at 1024 x 2,000 took 0.32-0.37 s with it against 0.27-0.33 s
    // with this (three alternating runs each, coordinator_bench).
    char b[kMaxVarint * 5];
    size_t n = put_uvarint(b, v.size());
    size_t k = 0;
    for (; k < v.size() && k < 4; ++k) n += put_uvarint(b + n, zigzag(v[k]));
    out_.append(b, n);
    for (; k < v.size(); ++k) varint(v[k]);
  }
  void strs(const std::vector<std::string>& v) {
    count(v.size());
    for (const auto& s : v) str(s);
  }
  /// Bytes as they are, with no length: what an earlier Writer's view() returned.
  void raw(std::string_view bytes) { out_.append(bytes); }
  size_t size() const { return out_.size(); }
  /// The bytes written since `from`, an earlier size().
  std::string_view view(size_t from) const { return std::string_view(out_).substr(from); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

/// Counts the bytes a Writer would write: an encoder written once for both (a template over
/// the writer) sizes a message with a Sizer, then writes it into one buffer of that size
/// (Writer::reserve). A message of hundreds of MiB written into a growing buffer would be
/// copied into fresh memory at each doubling.
class Sizer {
 public:
  void u8(uint8_t) { n_ += 1; }
  void i64(int64_t) { n_ += 8; }
  void count(size_t n) { n_ += uvarint_size(n); }
  void varint(int64_t v) { n_ += uvarint_size(zigzag(v)); }
  void str(const std::string& s) {
    count(s.size());
    n_ += s.size();
  }
  void ints(c10::IntArrayRef v) {
    count(v.size());
    for (int64_t x : v) varint(x);
  }
  void strs(const std::vector<std::string>& v) {
    count(v.size());
    for (const auto& s : v) str(s);
  }
  void raw(std::string_view bytes) { n_ += bytes.size(); }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
};

class Reader {
 public:
  /// Reads `in`, which must outlive the reader.
  explicit Reader(const std::string& in) : data_(in.data()), size_(in.size()) {}
  uint8_t u8() { return static_cast<uint8_t>(*take(1)); }
  int64_t i64() {
    int64_t v;
    std::memcpy(&v, take(8), 8);
    return v;
  }
  /// A signed varint (Writer::varint).
  int64_t varint() { return unzigzag(uvarint()); }
  std::string str() {
    const size_t n = count();
    return std::string(take(n), n);
  }
  Dims ints() {
    Dims v;
    ints_into(v);
    return v;
  }
  /// str() and ints() into a field of the object being decoded. A decoder that builds its
  /// result in place (instead of returning each part and moving it into its field) saves a
  /// copy per Dims (its four inline slots move by copying) and a move per part: a quarter of
  /// the plans' decoding time at 2 million items (docs/performance.md).
  void str_into(std::string& out) { str_into(out, count()); }
  /// The next `n` bytes into `out`, where their length was read apart from them.
  void str_into(std::string& out, size_t n) {
    // Built at its size and moved in: assign() into an empty string would give a name of 16
    // to 30 bytes a capacity of 30 (libstdc++ doubles the inline capacity of 15).
    out = std::string(take(n), n);
  }
  void ints_into(Dims& out) {
    const size_t n = count();  // at most the bytes left: a truncated message allocates little
    out.resize(n);
    for (size_t k = 0; k < n; ++k) out[k] = varint();
  }
  std::vector<std::string> strs() {
    std::vector<std::string> v(count());
    for (auto& s : v) s = str();
    return v;
  }
  /// A count or length (Writer::count) of things that take at least `min_bytes_each` bytes
  /// each (1: a length of bytes): a count beyond what the bytes left can hold is malformed,
  /// so what a decoder reserves for it stays within a small multiple of the message.
  size_t count(size_t min_bytes_each = 1) {
    const uint64_t n = uvarint();
    TORCH_CHECK(n <= (size_ - pos_) / min_bytes_each, "wire: bad count");
    return static_cast<size_t>(n);
  }
  bool done() const { return pos_ == size_; }
  size_t left() const { return size_ - pos_; }
  /// Where the next read starts (for view()).
  size_t position() const { return pos_; }
  /// The bytes read since `from`, an earlier position().
  std::string_view view(size_t from) const {
    return std::string_view(data_, size_).substr(from, pos_ - from);
  }
  /// Consumes the next bytes when they equal `bytes`; returns whether they did.
  bool skip_if_next(std::string_view bytes) {
    if (bytes.size() > size_ - pos_ ||
        std::memcmp(data_ + pos_, bytes.data(), bytes.size()) != 0) {
      return false;
    }
    pos_ += bytes.size();
    return true;
  }

 private:
  uint64_t uvarint() {
    const auto* p = reinterpret_cast<const uint8_t*>(data_) + pos_;
    const size_t left = size_ - pos_;
    if (left > 0 && p[0] < 0x80) {  // most counts, lengths and properties
      ++pos_;
      return p[0];
    }
    uint64_t v = 0;
    for (size_t k = 0; k < kMaxVarint; ++k) {
      TORCH_CHECK(k < left, "wire: message truncated");
      v |= static_cast<uint64_t>(p[k] & 0x7f) << (7 * k);
      if (p[k] < 0x80) {
        // The tenth byte holds the 64th bit only; a final zero byte is a longer form than
        // the writer makes.
        TORCH_CHECK((k < kMaxVarint - 1 || p[k] <= 1) && (k == 0 || p[k] != 0),
                    "wire: malformed varint");
        pos_ += k + 1;
        return v;
      }
    }
    TORCH_CHECK(false, "wire: malformed varint (more than ", kMaxVarint, " bytes)");
    return 0;
  }
  const char* take(size_t n) {
    TORCH_CHECK(n <= size_ - pos_, "wire: message truncated");
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace dcp::detail::wire
