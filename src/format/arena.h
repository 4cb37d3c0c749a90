// A bump allocator for the pickle reader's object trees, and the memory '.metadata' is read
// into (storage/metadata_file.cpp): memory handed out in growing chunks and released all at
// once when the arena dies.
//
// A '.metadata' at scale parses into gigabytes of small objects, and on Linux the cost of that
// is first touching the pages, not the parsing. Chunks of 2 MiB and more are therefore their own
// anonymous mappings, aligned to 2 MiB and advised MADV_HUGEPAGE: where transparent huge pages
// are on ("always" or "madvise"), one fault maps 2 MiB instead of 4 KiB. Elsewhere they are
// ordinary pages. Small trees (a torch.save data.pkl) stay in small heap chunks.
//
// Thread-safety: none; one arena belongs to one tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace dcp::detail {

class Arena {
 public:
  Arena() = default;
  // A moved-from arena is empty (it hands out nothing of the chunks it gave away).
  Arena(Arena&& other) noexcept
      : chunks_(std::move(other.chunks_)),
        next_(std::exchange(other.next_, nullptr)),
        left_(std::exchange(other.left_, 0)),
        reserved_(std::exchange(other.reserved_, 0)) {}
  Arena& operator=(Arena&& other) noexcept {
    chunks_ = std::move(other.chunks_);
    other.chunks_.clear();
    next_ = std::exchange(other.next_, nullptr);
    left_ = std::exchange(other.left_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
    return *this;
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() = default;

  /// `bytes` of uninitialized memory aligned to `align` (a power of two, at most 16), valid
  /// until the arena dies. Throws std::bad_alloc when the system has no memory left.
  void* allocate(size_t bytes, size_t align) {
    const size_t pad = (align - reinterpret_cast<uintptr_t>(next_) % align) % align;
    if (bytes + pad > left_) return allocate_in_new_chunk(bytes);
    void* p = next_ + pad;
    next_ += pad + bytes;
    left_ -= pad + bytes;
    return p;
  }
  /// Uninitialized room for n values of a trivially destructible T.
  template <typename T>
  T* allocate_array(size_t n) {
    static_assert(std::is_trivially_destructible_v<T>, "the arena runs no destructors");
    return static_cast<T*>(allocate(n * sizeof(T), alignof(T)));
  }

  /// Bytes reserved from the system so far (chunks, not what was handed out).
  size_t reserved() const { return reserved_; }

 private:
  // One chunk: heap memory, or an anonymous mapping for the large ones.
  class Chunk {
   public:
    explicit Chunk(size_t bytes);
    Chunk(Chunk&& other) noexcept;
    Chunk& operator=(Chunk&& other) noexcept;
    Chunk(const Chunk&) = delete;
    Chunk& operator=(const Chunk&) = delete;
    ~Chunk();
    char* data() const { return data_; }

   private:
    void release() noexcept;
    char* data_ = nullptr;      // the usable, aligned start
    void* mapping_ = nullptr;   // what munmap takes (null for heap chunks)
    size_t mapping_size_ = 0;
  };

  void* allocate_in_new_chunk(size_t bytes);

  std::vector<Chunk> chunks_;
  char* next_ = nullptr;
  size_t left_ = 0;
  size_t reserved_ = 0;
};

}  // namespace dcp::detail
