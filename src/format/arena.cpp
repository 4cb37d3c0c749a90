// The pickle reader's arena (see arena.h).
#include "format/arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

namespace dcp::detail {

namespace {
constexpr size_t kFirstChunk = size_t{64} << 10;  // a data.pkl fits in one
constexpr size_t kLargestChunk = size_t{64} << 20;
constexpr size_t kHugePage = size_t{2} << 20;     // x86-64 and arm64 (4 KiB base pages)
}  // namespace

Arena::Chunk::Chunk(size_t bytes) {
  if (bytes < kHugePage) {
    data_ = new char[bytes];
    return;
  }
  // Map one huge page more than asked, so that a 2 MiB-aligned start exists inside.
  mapping_size_ = bytes + kHugePage;
  mapping_ = mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw std::bad_alloc();
  }
  const auto base = reinterpret_cast<uintptr_t>(mapping_);
  data_ = reinterpret_cast<char*>((base + kHugePage - 1) & ~(kHugePage - 1));
  // Only a hint: kernels without transparent huge pages refuse it, and then the chunk is
  // ordinary pages.
  (void)madvise(data_, bytes, MADV_HUGEPAGE);
}

Arena::Chunk::Chunk(Chunk&& other) noexcept
    : data_(other.data_), mapping_(other.mapping_), mapping_size_(other.mapping_size_) {
  other.data_ = nullptr;
  other.mapping_ = nullptr;
}

Arena::Chunk& Arena::Chunk::operator=(Chunk&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    mapping_ = other.mapping_;
    mapping_size_ = other.mapping_size_;
    other.data_ = nullptr;
    other.mapping_ = nullptr;
  }
  return *this;
}

Arena::Chunk::~Chunk() { release(); }

void Arena::Chunk::release() noexcept {
  if (mapping_ != nullptr) {
    munmap(mapping_, mapping_size_);
  } else {
    delete[] data_;
  }
  data_ = nullptr;
  mapping_ = nullptr;
}

void* Arena::allocate_in_new_chunk(size_t bytes) {
  // Chunks double from 64 KiB to 64 MiB; a larger request gets a chunk of its own size. The
  // rest of the old chunk is abandoned (at most what the next request needed).
  const size_t grown = chunks_.empty() ? kFirstChunk : std::min(2 * reserved_, kLargestChunk);
  const size_t size = std::max(grown, bytes);
  chunks_.emplace_back(size);
  reserved_ += size;
  next_ = chunks_.back().data() + bytes;
  left_ = size - bytes;
  return chunks_.back().data();
}

}  // namespace dcp::detail
