// Output streams over one data file, for FileSystemWriter's records.
//
// BufferedFileOutput: small writes (zip headers) gather in a 1 MiB buffer; large ones (tensor
// bytes) go to write(2) straight from the caller's memory, through the page cache.
//
// DirectFileOutput: for a file opened with O_DIRECT. Everything is copied into an 8 MiB
// staging buffer aligned to 4 KiB, and each full buffer is one O_DIRECT write: the bytes go
// from the buffer to the device without filling the page cache, which on the development
// machine wrote 1.7 GB/s against 0.9 GB/s buffered + fsync (docs/performance.md). finish()
// writes the aligned part of the last buffer the same way and the tail (under 4 KiB) with
// O_DIRECT turned off. If the file system refuses an O_DIRECT write (EINVAL), the stream turns
// O_DIRECT off and goes on with ordinary writes.
//
// Thread-safety: one stream per file, used from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "io/file.h"
#include "storage/write_items.h"

namespace dcp::detail {

class BufferedFileOutput : public OutputStream {
 public:
  explicit BufferedFileOutput(File& file);
  void write(const void* data, size_t n) override;
  uint64_t position() const override { return position_; }
  /// Writes what is buffered. Call before syncing or closing the file.
  void finish();

 private:
  static constexpr size_t kBufferSize = size_t{1} << 20;
  File& file_;
  std::string buffer_;
  uint64_t position_ = 0;
};

class DirectFileOutput : public OutputStream {
 public:
  static constexpr size_t kAlignment = 4096;
  static constexpr size_t kBufferSize = size_t{8} << 20;

  /// `file` must have been opened with O_DIRECT (File::open_direct), at offset 0.
  explicit DirectFileOutput(File& file);
  void write(const void* data, size_t n) override;
  uint64_t position() const override { return position_; }
  /// Writes what is buffered. Call before syncing or closing the file; no write may follow.
  void finish();
  /// Whether the file system refused an O_DIRECT write, so that the stream went on without.
  bool fell_back() const { return fell_back_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  // Writes buffer_[0, n); n is a multiple of kAlignment unless O_DIRECT is off.
  void write_buffer(size_t n);

  File& file_;
  std::unique_ptr<char, Free> buffer_;
  size_t used_ = 0;
  uint64_t position_ = 0;
  bool direct_ = true;
  bool fell_back_ = false;
};

}  // namespace dcp::detail
