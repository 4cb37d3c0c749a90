// FileSystemWriter's output streams (see file_output.h).
#include "storage/file_output.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace dcp::detail {

BufferedFileOutput::BufferedFileOutput(File& file) : file_(file) { buffer_.reserve(kBufferSize); }

void BufferedFileOutput::write(const void* data, size_t n) {
  if (buffer_.size() + n > kBufferSize) finish();
  if (n >= kBufferSize) {
    file_.write_all(data, n);
  } else {
    buffer_.append(static_cast<const char*>(data), n);
  }
  position_ += n;
}

void BufferedFileOutput::finish() {
  if (!buffer_.empty()) file_.write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

std::unique_ptr<char, DirectFileOutput::Free> DirectFileOutput::aligned_buffer() {
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, kBufferSize) != 0) throw std::bad_alloc();
  return std::unique_ptr<char, Free>(static_cast<char*>(p));
}

DirectFileOutput::DirectFileOutput(File& file)
    : file_(file), buffer_(aligned_buffer()), spare_(aligned_buffer()) {}

DirectFileOutput::~DirectFileOutput() {
  if (pending_.valid()) pending_.wait();
}

// Note [Double buffering]: a full buffer is written by a background task while write() fills
// the other, so that copying the records (and their CRCs, computed by the caller) overlaps the
// disk's work. One write is in flight at a time, in file order: before handing over the next
// buffer, write() waits for the previous write, which also returns the spare buffer. A failed
// write's error comes back on that wait or in finish(). With one rank and one IO thread, a
// save otherwise leaves the disk idle while it copies and the CPU idle while it writes
// (docs/performance.md, "The scaling curve").
void DirectFileOutput::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  position_ += n;
  while (n > 0) {
    const size_t take = std::min(n, kBufferSize - used_);
    std::memcpy(buffer_.get() + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ == kBufferSize) {
      wait_pending();
      std::swap(buffer_, spare_);
      used_ = 0;
      pending_ = std::async(std::launch::async,
                            [this, full = spare_.get()] { write_out(full, kBufferSize); });
    }
  }
}

void DirectFileOutput::wait_pending() {
  if (pending_.valid()) pending_.get();
}

void DirectFileOutput::finish() {
  wait_pending();
  const size_t aligned = used_ / kAlignment * kAlignment;
  if (aligned > 0) {
    const size_t tail = used_ - aligned;
    write_out(buffer_.get(), aligned);
    std::memmove(buffer_.get(), buffer_.get() + aligned, tail);
    used_ = tail;
  }
  if (used_ > 0) {
    if (direct_) {
      file_.clear_direct();
      direct_ = false;
    }
    write_out(buffer_.get(), used_);
    used_ = 0;
  }
}

void DirectFileOutput::write_out(const char* data, size_t n) {
  if (direct_ && !file_.write_all_direct(data, n)) {
    file_.clear_direct();
    direct_ = false;
    fell_back_ = true;
  }
  if (!direct_) file_.write_all(data, n);
}

}  // namespace dcp::detail
