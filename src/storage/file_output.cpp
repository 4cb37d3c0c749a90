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

DirectFileOutput::DirectFileOutput(File& file) : file_(file) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, kBufferSize) != 0) throw std::bad_alloc();
  buffer_.reset(static_cast<char*>(p));
}

void DirectFileOutput::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  position_ += n;
  while (n > 0) {
    const size_t take = std::min(n, kBufferSize - used_);
    std::memcpy(buffer_.get() + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ == kBufferSize) write_buffer(kBufferSize);
  }
}

void DirectFileOutput::finish() {
  const size_t aligned = used_ / kAlignment * kAlignment;
  if (aligned > 0) {
    const size_t tail = used_ - aligned;
    write_buffer(aligned);
    std::memmove(buffer_.get(), buffer_.get() + aligned, tail);
    used_ = tail;
  }
  if (used_ > 0) {
    if (direct_) {
      file_.clear_direct();
      direct_ = false;
    }
    write_buffer(used_);
  }
}

void DirectFileOutput::write_buffer(size_t n) {
  if (direct_ && !file_.write_all_direct(buffer_.get(), n)) {
    file_.clear_direct();
    direct_ = false;
    fell_back_ = true;
  }
  if (!direct_) file_.write_all(buffer_.get(), n);
  used_ = 0;
}

}  // namespace dcp::detail
