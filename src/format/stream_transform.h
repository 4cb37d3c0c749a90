// Python DCP's stream transforms (torch/distributed/checkpoint/_extension.py): an item written
// through FileSystemWriter(_extensions=[ZStandard()]) is its usual bytes (a torch.save record)
// passed through zstd, and its StorageInfo lists the descriptor "stream.zstd/1". dcp reads
// such items (any number of zstd frames, as the zstandard and pyzstd streams write them) and
// writes them (one frame per item). Every other descriptor is a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/torch_save.h"

struct ZSTD_CCtx_s;

namespace dcp::detail {

/// The descriptor of Python's ZStandard extension, as dcp writes it.
inline constexpr const char* kZstdDescriptor = "stream.zstd/1";

/// Checks an item's transform descriptors: true for exactly one zstd transform of version
/// 1.x, false for none; throws c10::NotImplementedError naming any other.
bool is_zstd_item(const std::vector<std::string>& descriptors);

/// A ByteSink stage that compresses what it is given into one zstd frame for `out`.
/// RAII owner of the compression context. finish() ends the frame; without it the output is
/// a truncated frame.
class ZstdCompressor {
 public:
  ZstdCompressor(ByteSink out, int level);
  ~ZstdCompressor();
  ZstdCompressor(const ZstdCompressor&) = delete;
  ZstdCompressor& operator=(const ZstdCompressor&) = delete;

  void write(const void* data, size_t n);
  void finish();

 private:
  void pump(const void* data, size_t n, bool end);

  struct Free {
    void operator()(ZSTD_CCtx_s* ctx) const;
  };
  std::unique_ptr<ZSTD_CCtx_s, Free> ctx_;
  ByteSink out_;
  std::vector<char> buffer_;
};

/// The decompressed bytes of all of `source`. Throws c10::Error naming the source when the
/// stream is corrupt or truncated, or when it decompresses to more than `max_bytes` (a hostile
/// file cannot make dcp allocate more than that).
std::string zstd_decompress(const ArchiveSource& source, uint64_t max_bytes);

/// An archive held in memory (a decompressed item); describe() names where it came from.
class BufferSource : public ArchiveSource {
 public:
  BufferSource(std::string data, std::string origin)
      : data_(std::move(data)), origin_(std::move(origin)) {}
  /// Bytes read whole from `source`, which outlives this and describes them (only on errors:
  /// a load of small tensors reads 20,000 records per rank this way).
  BufferSource(std::string data, const ArchiveSource& source)
      : data_(std::move(data)), source_(&source) {}
  uint64_t size() const override { return data_.size(); }
  void read(uint64_t offset, void* dst, size_t n) const override;
  std::string describe() const override { return source_ ? source_->describe() : origin_; }

 private:
  std::string data_;
  std::string origin_;
  const ArchiveSource* source_ = nullptr;
};

}  // namespace dcp::detail
