// torch.save records: the zip archives that hold each item of a '.distcp' file (docs/format.md §3).
// Writing uses LibTorch's PyTorchStreamWriter (the same container code torch.save uses);
// data.pkl is written by our protocol-2 writer with only weights_only-safe opcodes. Reading walks
// the checked zip directory over a random-access source (zip_directory.h), the way LibTorch's
// PyTorchStreamReader reads it, and our restricted pickle reader.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "dcp/state_dict.h"

namespace dcp::detail {

/// Receives the archive's bytes in order. Throws on failure.
using ByteSink = std::function<void(const void* data, size_t size)>;

/// Writes `tensor` as Python's torch.save(tensor) would (one storage "0", compact, row-major
/// when the tensor is not already compact). REQUIRES: a CPU tensor. Returns bytes written.
uint64_t write_tensor_archive(const at::Tensor& tensor, const ByteSink& sink);

/// Writes a non-tensor value (tensors nested inside are allowed) as torch.save(value).
/// Returns bytes written.
uint64_t write_value_archive(const Value& value, const ByteSink& sink);

/// Random access to one archive: bytes [0, size()) of some larger file.
class ArchiveSource {
 public:
  virtual ~ArchiveSource() = default;
  virtual uint64_t size() const = 0;
  /// Reads exactly n bytes at `offset` (relative to the archive). Throws c10::Error naming
  /// the file and absolute byte range when they are not there.
  virtual void read(uint64_t offset, void* dst, size_t n) const = 0;
  /// "'__0_0.distcp' [1024, 2048)", for messages.
  virtual std::string describe() const = 0;
};

/// Where a tensor record's elements sit and how they are laid out.
struct TensorRecord {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;  // elements
  uint64_t data_offset = 0;    // bytes, from the archive start to the storage's first byte
  uint64_t storage_bytes = 0;
  /// The CRC-32 the zip directory records for the storage's record, when the record holds
  /// exactly the storage's bytes (what torch.save writes): a read of all of them can check it.
  std::optional<uint32_t> storage_crc32;
};

/// A byte range [begin, end).
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const ByteRange& o) const { return begin == o.begin && end == o.end; }
};

/// Note [Record geometry]: where the bytes of a tensor record can sit, known before its
/// header is read. A record of `length` bytes holding a contiguous chunk of `data_bytes` has
/// `slack = length - data_bytes` bytes of zip headers, data.pkl and trailer, so its data starts
/// somewhere in [0, slack]: data byte k lies in [k, slack + k], every header byte in
/// [0, slack) and every trailer byte in [length - slack, length). Reading the record's header
/// touches the head; the zip reader (read_zip_directory, as miniz) finds the end of the
/// central directory by reading the record's last kZipTailRead bytes in one go, so the tail
/// grows to that. The bounds assume what dcp and Python DCP write (a contiguous chunk at
/// storage offset 0); for any other record they are merely loose, and readers must not rely on
/// them for correctness, only for hints.
class RecordGeometry {
 public:
  /// The zip reader's first read: the last bytes of the archive.
  static constexpr uint64_t kZipTailRead = 4096;

  /// nullopt when `data_bytes` cannot fit in `length`.
  static std::optional<RecordGeometry> of(uint64_t length, uint64_t data_bytes);

  /// Ranges relative to the record's first byte.
  ByteRange head() const { return {0, slack_}; }
  ByteRange tail() const;
  /// Where data bytes [first, end) of the chunk can lie.
  ByteRange data(uint64_t first, uint64_t end) const;

 private:
  RecordGeometry(uint64_t length, uint64_t slack) : length_(length), slack_(slack) {}
  uint64_t length_;
  uint64_t slack_;
};

/// Throws c10::Error naming the item when `crc` (of bytes just read) is not the CRC-32 `record`
/// declares for its storage; does nothing when it declares none.
void check_storage_crc32(const ArchiveSource& source, const TensorRecord& record, uint32_t crc);

/// Parses a tensor item's data.pkl and locates its storage, without reading the storage.
TensorRecord read_tensor_record(const ArchiveSource& source);

/// Reads a whole tensor item into a new CPU tensor (with the saved strides); with
/// `verify_crc32`, checks the storage against the CRC-32 its zip entry records.
at::Tensor read_tensor_archive(const ArchiveSource& source, bool verify_crc32 = true);

/// Reads a byte item (any torch.save'd Python value made of None, bool, int, float, str, bytes,
/// list, tuple, dict, OrderedDict, torch.Size and tensors).
Value read_value_archive(const ArchiveSource& source, bool verify_crc32 = true);

}  // namespace dcp::detail
