// The read side shared by file-like backends: executing one rank's load plan against
// random-access input files. FileSystemReader and MemoryReader differ only in where the bytes
// come from. The plan's schedule (order, ranges, announcements) comes from read_schedule.h.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <memory>
#include <string>

#include "dcp/metadata.h"
#include "dcp/planner.h"
#include "format/stream_transform.h"
#include "format/torch_save.h"
#include "storage/read_schedule.h"

namespace dcp::detail {

/// A read-only random-access file. Thread-safe: IO threads read one file concurrently.
class InputFile {
 public:
  virtual ~InputFile() = default;
  virtual const std::string& name() const = 0;
  virtual uint64_t size() const = 0;
  /// Reads exactly n bytes at `offset`; throws naming the file and range otherwise.
  virtual void read(uint64_t offset, void* dst, size_t n) const = 0;
  /// A hint that [offset, offset + n) will be read soon: a file on disk starts reading it in
  /// the background. Never throws; the default does nothing.
  virtual void prefetch(uint64_t offset, uint64_t n) const {}
};

/// One saved item: bytes [offset, offset + length) of a data file, as storage_data places it.
/// REQUIRES: offset and length are not negative (schedule_reads checks them).
class ItemSource : public ArchiveSource {
 public:
  /// Throws, naming the file, when the item lies past the file's end.
  ItemSource(std::shared_ptr<const InputFile> file, const StorageInfo& info);
  uint64_t size() const override { return static_cast<uint64_t>(info_.length); }
  void read(uint64_t offset, void* dst, size_t n) const override;
  std::string describe() const override;

 private:
  std::shared_ptr<const InputFile> file_;
  StorageInfo info_;
};

/// The bytes of a saved record as an archive: `item` itself, or for a zstd item (Note
/// [Compressed items]) its whole decompressed stream, at most `max_decoded_bytes` of it, kept
/// in `decoded`. The result refers to `item` or to `decoded`.
const ArchiveSource& decoded_record(const ItemSource& item, const StorageInfo& info,
                                    uint64_t max_decoded_bytes,
                                    std::optional<BufferSource>& decoded);

using FileOpener = std::function<std::shared_ptr<const InputFile>(const std::string& relative)>;

/// Executes a load plan: for every saved item the plan touches, hands the pieces to the planner
/// (load_bytes, or resolve_tensor + copy + commit_tensor). Errors keep their type and gain the
/// item, the file and the record's byte range as context.
void read_items(const LoadPlan& plan, LoadPlanner& planner, const Metadata& metadata,
                const FileOpener& open, const ReadOptions& options = {});

/// StorageReader::read_data for a file-like backend: read_items against the metadata given to
/// set_up_storage_reader (an error when there was none: null), its outcome in a ready future.
std::future<void> read_data(const LoadPlan& plan, LoadPlanner& planner,
                            const Metadata* metadata, const FileOpener& open,
                            const ReadOptions& options = {});

}  // namespace dcp::detail
