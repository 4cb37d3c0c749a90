// The protocol-2 pickle writer (see pickle.h). It emits only opcodes that Python's
// weights_only unpickler accepts (docs/format.md §3), so the same writer serves '.metadata' and
// torch.save's data.pkl: PROTO, GLOBAL, MARK, TUPLE*, EMPTY_*, APPENDS, SETITEMS, REDUCE,
// NEWOBJ, BUILD, BINPERSID, NONE, NEWTRUE/NEWFALSE, BININT*, LONG1, BINFLOAT, BINUNICODE,
// BINPUT/LONG_BINPUT, BINGET/LONG_BINGET, STOP.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "format/pickle.h"

namespace dcp::detail::pickle {

Writer::Writer() {
  op(PickleOpCode::PROTO);
  byte(2);
}

Writer::Writer(Sink sink, size_t piece_bytes) : sink_(std::move(sink)) {
  TORCH_INTERNAL_ASSERT(sink_ && piece_bytes > 0, "a streaming pickle writer needs a sink");
  out_.resize(piece_bytes);
  op(PickleOpCode::PROTO);
  byte(2);
}

Writer::MemoIndex Writer::memoize_top(MemoTable& table, std::string key) {
  const MemoIndex index = next_memo_++;
  table.emplace(keys_.emplace_back(std::move(key)), index);
  memo_op(PickleOpCode::BINPUT, PickleOpCode::LONG_BINPUT, index);
  return index;
}

void Writer::wide_integer(int64_t v) {
  if (v >= 0 && v < 65536) {
    op(PickleOpCode::BININT2);
    byte(static_cast<uint8_t>(v));
    byte(static_cast<uint8_t>(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(PickleOpCode::BININT);
    u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
  } else {
    // LONG1: minimal little-endian two's complement.
    uint8_t bytes[8];
    auto u = static_cast<uint64_t>(v);
    for (int k = 0; k < 8; ++k) bytes[k] = static_cast<uint8_t>(u >> (8 * k));
    int n = 8;
    while (n > 1) {
      const bool sign_next = bytes[n - 2] & 0x80;
      if ((bytes[n - 1] == 0x00 && !sign_next) || (bytes[n - 1] == 0xff && sign_next)) --n;
      else break;
    }
    op(PickleOpCode::LONG1);
    byte(static_cast<uint8_t>(n));
    for (int k = 0; k < n; ++k) byte(bytes[k]);
  }
}

void Writer::float64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  op(PickleOpCode::BINFLOAT);
  for (int k = 7; k >= 0; --k) byte(static_cast<uint8_t>(bits >> (8 * k)));
}

Writer::MemoIndex Writer::str(std::string_view v) {
  if (auto it = strs_.find(v); it != strs_.end()) {
    get(it->second);
    return it->second;
  }
  TORCH_CHECK(v.size() <= UINT32_MAX, "string too long to pickle");
  op(PickleOpCode::BINUNICODE);
  u32(static_cast<uint32_t>(v.size()));
  append(v);
  return memoize_top(strs_, std::string(v));
}

void Writer::bytes(std::string_view v) {
  // Python 3 pickles bytes under protocol 2 as _codecs.encode(v.decode('latin1'), 'latin1').
  global("_codecs", "encode");
  std::string utf8;
  utf8.reserve(v.size());
  for (unsigned char c : v) {
    if (c < 0x80) {
      utf8.push_back(static_cast<char>(c));
    } else {
      utf8.push_back(static_cast<char>(0xc0 | (c >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  op(PickleOpCode::BINUNICODE);
  u32(static_cast<uint32_t>(utf8.size()));
  append(utf8);
  str("latin1");
  tuple(2);
  reduce();
}

Writer::MemoIndex Writer::global(std::string_view module, std::string_view name) {
  std::string key;
  key.reserve(module.size() + name.size() + 1);
  key.append(module).append("\n").append(name);
  if (auto it = globals_.find(key); it != globals_.end()) {
    get(it->second);
    return it->second;
  }
  op(PickleOpCode::GLOBAL);
  append(key);
  byte('\n');
  return memoize_top(globals_, std::move(key));
}

void Writer::tuple(size_t n) {
  switch (n) {
    case 0: op(PickleOpCode::EMPTY_TUPLE); break;
    case 1: op(PickleOpCode::TUPLE1); break;
    case 2: op(PickleOpCode::TUPLE2); break;
    case 3: op(PickleOpCode::TUPLE3); break;
    default: TORCH_INTERNAL_ASSERT(false, "tuple(n) with n > 3 needs mark() and tuple_from_mark()");
  }
}

void Writer::extend(size_t n) {
  if (sink_) {
    // Every byte before written_ is final (room()'s callers fill what they asked for at once).
    flush();
    if (out_.size() < n) out_.resize(n);
    return;
  }
  // Doubles, as push_back would (a small pickle stays small).
  out_.resize(std::max({written_ + n, 2 * out_.size(), size_t{256}}));
}

void Writer::flush() {
  if (written_ > 0) sink_(std::string_view(out_.data(), written_));
  written_ = 0;
}

std::string Writer::finish() {
  op(PickleOpCode::STOP);
  if (sink_) {
    flush();
    return {};
  }
  out_.resize(written_);
  written_ = 0;
  return std::move(out_);
}

}  // namespace dcp::detail::pickle
