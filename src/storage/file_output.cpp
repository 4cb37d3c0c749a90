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

DirectFileOutput::DirectFileOutput(File& file) : file_(file), buffer_(aligned_buffer()) {}

DirectFileOutput::~DirectFileOutput() {
  for (const Pending& write : pending_) write.done.wait();
}

// Note [Write queue]: full buffers are written by background tasks while write() fills the
// next, so that copying the records (and their CRCs, computed by the caller) overlaps the
// disk's work. Each task first waits for the one before it, so the writes reach the file one
// at a time and in file order; a failed write's error passes down the chain, and no later
// buffer is written. write() waits for the oldest write only when all kBuffers buffers are
// taken, and a wait rethrows the error; finish() waits for them all.
//
// Why a queue rather than two buffers: how long a buffer takes to fill depends on what it
// holds. With the two 8 MiB buffers of before, 8 MiB of one large tensor was one memcpy (about
// 1 ms here) and 8 MiB of 250 small records was 250 archives' headers, pickles and CRCs
// (3-4 ms); the disk takes the same time for either. Each buffer cost the slower of its fill
// and its write, so a save of small and large tensors paid both: a 1-rank save of
// bench_state.h's "small" state spent 0.23-0.25 s of its 0.57 s write waiting for the disk,
// with the disk busy for 0.34-0.38 s of it. With kBuffers the fast fills run ahead while the
// disk catches up (docs/performance.md, "A queue of writes").
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
      if (free_.empty() && 1 + pending_.size() < kBuffers) free_.push_back(aligned_buffer());
      if (free_.empty()) wait_oldest();
      std::shared_future<void> before =
          pending_.empty() ? std::shared_future<void>() : pending_.back().done;
      std::shared_future<void> done =
          std::async(std::launch::async, [this, full = buffer_.get(), before] {
            if (before.valid()) before.get();
            write_out(full, kBufferSize);
          }).share();
      pending_.push_back(Pending{std::move(buffer_), std::move(done)});
      buffer_ = std::move(free_.back());
      free_.pop_back();
      used_ = 0;
    }
  }
}

void DirectFileOutput::wait_oldest() {
  Pending oldest = std::move(pending_.front());
  pending_.pop_front();
  oldest.done.wait();  // its buffer is free from here on, whether it was written or not
  free_.push_back(std::move(oldest.buffer));
  oldest.done.get();
}

void DirectFileOutput::finish() {
  while (!pending_.empty()) wait_oldest();
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
