// Output streams over one data file, for FileSystemWriter's records (and the commit's
// '.metadata', storage/metadata_file.cpp).
//
// BufferedFileOutput: small writes (zip headers) gather in a 1 MiB buffer; large ones (tensor
// bytes) go to write(2) straight from the caller's memory, through the page cache.
//
// DirectFileOutput: for a file opened with O_DIRECT. Everything is copied into a 4 MiB
// staging buffer aligned to 4 KiB, and each full buffer is one O_DIRECT write: the bytes go
// from the buffer to the device without filling the page cache, which on the development
// machine wrote 1.7 GB/s against 0.9 GB/s buffered + fsync (docs/performance.md). There are
// kBuffers such buffers: full ones are written in file order on background threads while the
// caller fills the next (Note [Write queue]). finish() writes the aligned part of the last
// buffer the same way and the tail (under 4 KiB) with O_DIRECT turned off. If the file system
// refuses an O_DIRECT write (EINVAL), the stream turns O_DIRECT off and goes on with ordinary
// writes.
//
// Thread-safety: one stream per file, used from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

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
  static constexpr size_t kBufferSize = size_t{4} << 20;
  /// Staging buffers per stream: one being filled, the others queued for the disk.
  static constexpr size_t kBuffers = 4;

  /// `file` must have been opened with O_DIRECT (File::open_direct), at offset 0.
  explicit DirectFileOutput(File& file);
  /// Waits for the writes in flight (whose errors, if any, are then lost: call finish()).
  ~DirectFileOutput();
  DirectFileOutput(const DirectFileOutput&) = delete;
  DirectFileOutput& operator=(const DirectFileOutput&) = delete;
  void write(const void* data, size_t n) override;
  uint64_t position() const override { return position_; }
  /// Writes what is buffered, after the writes in flight. Call before syncing or closing the
  /// file; no write may follow. Throws the first failed write's error.
  void finish();
  /// Whether the file system refused an O_DIRECT write, so that the stream went on without.
  /// Only after finish().
  bool fell_back() const { return fell_back_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  static std::unique_ptr<char, Free> aligned_buffer();
  // Writes data[0, n) at the file's position; n is a multiple of kAlignment unless O_DIRECT
  // is off. Runs on one thread at a time: a background write's, each after the one before it,
  // or the caller's once it has waited for them all.
  void write_out(const char* data, size_t n);
  // Waits for the oldest background write, rethrowing its error, and frees its buffer.
  void wait_oldest();

  // A full buffer and its background write, which first waits for the write before it.
  struct Pending {
    std::unique_ptr<char, Free> buffer;
    std::shared_future<void> done;
  };

  File& file_;
  std::unique_ptr<char, Free> buffer_;            // being filled by write()
  std::vector<std::unique_ptr<char, Free>> free_;  // neither filled nor written
  // Being written, in file order; the destructor waits for them before the buffers go. With
  // buffer_ and free_, at most kBuffers buffers in all.
  std::deque<Pending> pending_;
  size_t used_ = 0;
  uint64_t position_ = 0;
  bool direct_ = true;      // used by write_out only
  bool fell_back_ = false;  // used by write_out only
};

}  // namespace dcp::detail
