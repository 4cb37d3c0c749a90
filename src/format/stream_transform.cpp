// Python DCP's stream transforms (see stream_transform.h). Every zstd error code becomes an
// exception in check_zstd.
#include "format/stream_transform.h"

#include <c10/util/Exception.h>
#include <zstd.h>

#include <cstring>

namespace dcp::detail {
namespace {

constexpr const char* kZstdName = "stream.zstd";

size_t check_zstd(size_t code, const char* what, const std::string& where) {
  TORCH_CHECK(!ZSTD_isError(code), "zstd ", what, " failed for ", where, ": ",
              ZSTD_getErrorName(code));
  return code;
}

struct FreeDStream {
  void operator()(ZSTD_DStream* s) const { ZSTD_freeDStream(s); }
};

}  // namespace

bool is_zstd_item(const std::vector<std::string>& descriptors) {
  if (descriptors.empty()) return false;
  const std::string& d = descriptors.front();
  const size_t slash = d.find('/');
  const std::string name = d.substr(0, slash);
  const std::string version = slash == std::string::npos ? "" : d.substr(slash + 1);
  TORCH_CHECK_NOT_IMPLEMENTED(
      descriptors.size() == 1 && name == kZstdName &&
          version.substr(0, version.find('.')) == "1",
      "stored with the transform", descriptors.size() > 1 ? "s " : " ", "'", d, "'",
      descriptors.size() > 1 ? " and more" : "",
      ", which dcp does not read (it reads Python's ZStandard extension, '", kZstdDescriptor,
      "')");
  return true;
}

void ZstdCompressor::Free::operator()(ZSTD_CCtx_s* ctx) const { ZSTD_freeCCtx(ctx); }

ZstdCompressor::ZstdCompressor(ByteSink out, int level)
    : ctx_(ZSTD_createCCtx()), out_(std::move(out)), buffer_(ZSTD_CStreamOutSize()) {
  TORCH_CHECK(ctx_ != nullptr, "zstd: out of memory creating a compression context");
  check_zstd(ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_compressionLevel, level),
             "setting the compression level", "a new item");
}

ZstdCompressor::~ZstdCompressor() = default;

void ZstdCompressor::write(const void* data, size_t n) { pump(data, n, false); }

void ZstdCompressor::finish() { pump(nullptr, 0, true); }

void ZstdCompressor::pump(const void* data, size_t n, bool end) {
  ZSTD_inBuffer in{data, n, 0};
  while (true) {
    ZSTD_outBuffer out{buffer_.data(), buffer_.size(), 0};
    const size_t remaining = check_zstd(
        ZSTD_compressStream2(ctx_.get(), &out, &in, end ? ZSTD_e_end : ZSTD_e_continue),
        "compression", "an item being written");
    if (out.pos > 0) out_(buffer_.data(), out.pos);
    if (end ? remaining == 0 : in.pos == in.size) return;
  }
}

std::string zstd_decompress(const ArchiveSource& source, uint64_t max_bytes) {
  std::unique_ptr<ZSTD_DStream, FreeDStream> stream(ZSTD_createDStream());
  TORCH_CHECK(stream != nullptr, "zstd: out of memory creating a decompression context");
  const std::string where = source.describe();
  check_zstd(ZSTD_initDStream(stream.get()), "initialisation", where);
  std::string out;
  std::vector<char> in_buffer(ZSTD_DStreamInSize());
  std::vector<char> out_buffer(ZSTD_DStreamOutSize());
  size_t last = 0;  // 0 once a frame is complete and flushed
  for (uint64_t offset = 0; offset < source.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(in_buffer.size(), source.size() - offset));
    source.read(offset, in_buffer.data(), n);
    offset += n;
    ZSTD_inBuffer in{in_buffer.data(), n, 0};
    while (in.pos < in.size) {
      ZSTD_outBuffer o{out_buffer.data(), out_buffer.size(), 0};
      last = check_zstd(ZSTD_decompressStream(stream.get(), &o, &in), "decompression", where);
      TORCH_CHECK(out.size() + o.pos <= max_bytes, "the zstd-compressed item ", where,
                  " decompresses to more than ", max_bytes,
                  " bytes, more than its metadata allows (corrupt or hostile file)");
      out.append(out_buffer.data(), o.pos);
    }
  }
  // Flush what the decoder still holds for a frame whose input is complete.
  while (last != 0) {
    ZSTD_inBuffer in{nullptr, 0, 0};
    ZSTD_outBuffer o{out_buffer.data(), out_buffer.size(), 0};
    last = check_zstd(ZSTD_decompressStream(stream.get(), &o, &in), "decompression", where);
    TORCH_CHECK(out.size() + o.pos <= max_bytes, "the zstd-compressed item ", where,
                " decompresses to more than ", max_bytes, " bytes");
    out.append(out_buffer.data(), o.pos);
    TORCH_CHECK(o.pos > 0 || last == 0, "the zstd-compressed item ", where,
                " ends in the middle of a frame (truncated?)");
  }
  return out;
}

void BufferSource::read(uint64_t offset, void* dst, size_t n) const {
  TORCH_CHECK(offset <= data_.size() && n <= data_.size() - offset, "reading ", describe(), " at [",
              offset, ", ", offset + n, "): past its end (", data_.size(), " bytes)");
  std::memcpy(dst, data_.data() + offset, n);
}

}  // namespace dcp::detail
