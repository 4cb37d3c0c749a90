// A small binary encoding for what ranks exchange during a save or load: plans, write
// results, outcomes. Little-endian fixed-width integers and length-prefixed strings. Only
// processes of the same build read it, so it carries no version.
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

class Writer {
 public:
  void reserve(size_t n) { out_.reserve(n); }
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void i64(int64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out_.append(b, 8);
  }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out_.append(s);
  }
  void ints(c10::IntArrayRef v) {
    i64(static_cast<int64_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  void strs(const std::vector<std::string>& v) {
    i64(static_cast<int64_t>(v.size()));
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
  void str(const std::string& s) { n_ += 8 + s.size(); }
  void ints(c10::IntArrayRef v) { n_ += 8 + v.size() * sizeof(int64_t); }
  void strs(const std::vector<std::string>& v) {
    i64(0);
    for (const auto& s : v) str(s);
  }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  uint8_t u8() { return static_cast<uint8_t>(*take(1)); }
  int64_t i64() {
    int64_t v;
    std::memcpy(&v, take(8), 8);
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    TORCH_CHECK(n >= 0, "wire: negative length");
    return std::string(take(static_cast<size_t>(n)), static_cast<size_t>(n));
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
  void str_into(std::string& out) {
    // Built at its size and moved in: assign() into an empty string would give a name of 16
    // to 30 bytes a capacity of 30 (libstdc++ doubles the inline capacity of 15).
    out = str();
  }
  void ints_into(Dims& out) {
    const size_t n = count();  // at most the bytes left, so n * 8 cannot overflow
    const char* bytes = take(n * sizeof(int64_t));  // a truncated message allocates nothing
    out.resize(n);
    std::memcpy(out.data(), bytes, n * sizeof(int64_t));
  }
  std::vector<std::string> strs() {
    std::vector<std::string> v(count());
    for (auto& s : v) s = str();
    return v;
  }
  size_t count() {
    const int64_t n = i64();
    TORCH_CHECK(n >= 0 && static_cast<uint64_t>(n) <= in_.size() - pos_, "wire: bad count");
    return static_cast<size_t>(n);
  }
  bool done() const { return pos_ == in_.size(); }
  size_t left() const { return in_.size() - pos_; }
  /// Where the next read starts (for view()).
  size_t position() const { return pos_; }
  /// The bytes read since `from`, an earlier position().
  std::string_view view(size_t from) const {
    return std::string_view(in_).substr(from, pos_ - from);
  }
  /// Consumes the next bytes when they equal `bytes`; returns whether they did.
  bool skip_if_next(std::string_view bytes) {
    if (bytes.size() > in_.size() - pos_ ||
        std::memcmp(in_.data() + pos_, bytes.data(), bytes.size()) != 0) {
      return false;
    }
    pos_ += bytes.size();
    return true;
  }

 private:
  const char* take(size_t n) {
    TORCH_CHECK(n <= in_.size() - pos_, "wire: message truncated");
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace dcp::detail::wire
