// POSIX file helpers: an owned file descriptor, full write and pread loops, fsync, atomic
// rename and directory fsync. errno is translated into c10::Error in exactly one place
// (errno_error), with the operation, the path and the OS message.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dcp::detail {

/// Throws c10::Error "<op> '<path>': <strerror(err)> (errno <err>)".
[[noreturn]] void throw_errno(const std::string& op, const std::string& path, int err);

/// Owns one file descriptor. Move-only; closes on destruction (errors ignored there; call
/// close() to see them).
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  /// open(2); throws on failure.
  static File open(const std::string& path, int flags, mode_t mode = 0644);
  /// Opens `dir`/`relative` for reading, refusing (with an error naming both) anything but a
  /// regular file whose real path lies inside `dir`'s: no FIFO or device (it is opened without
  /// blocking, then checked), no symbolic link that leaves the directory. `relative` is
  /// already a plain relative name (paths::check_relative_name).
  static File open_regular_inside(const std::string& dir, const std::string& relative);
  /// open(2) with O_DIRECT added; nullopt where the file system refuses O_DIRECT (EINVAL),
  /// throws on other failures.
  static std::optional<File> open_direct(const std::string& path, int flags, mode_t mode = 0644);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool valid() const { return fd_ >= 0; }

  void write_all(const void* data, size_t n);
  /// write_all for a file opened with O_DIRECT (aligned data, size and position). Returns
  /// false, having written nothing, when the file system refuses this O_DIRECT write (EINVAL):
  /// the caller may clear_direct() and write again.
  bool write_all_direct(const void* data, size_t n);
  /// Turns O_DIRECT off for this descriptor (fcntl); throws on failure.
  void clear_direct();
  /// Reserves the first `bytes` of the file as one allocation (fallocate), so that writers of
  /// several files at once do not interleave their blocks on disk; the file's size becomes
  /// `bytes`. Returns false where the file system cannot (nothing changed); throws on other
  /// failures (a full disk among them).
  bool preallocate(uint64_t bytes);
  /// ftruncate(2); throws on failure.
  void truncate(uint64_t size);
  /// Reads exactly n bytes at `offset`; throws naming the range when the file is shorter.
  void pread_all(void* data, size_t n, uint64_t offset) const;
  /// Asks the kernel to start reading [offset, offset + n) into the page cache now
  /// (posix_fadvise WILLNEED) and returns without waiting. Only a hint: failures are ignored.
  void advise_willneed(uint64_t offset, uint64_t n) const;
  uint64_t size() const;
  /// Takes an exclusive lock on the whole file without waiting (an open-file-description lock,
  /// F_OFD_SETLK: it excludes other descriptors in this process too, and is released when the
  /// descriptor closes or the process dies). kBusy when another holder has it; kUnsupported
  /// where the file system has no locks; throws on other errors.
  enum class Lock { kLocked, kBusy, kUnsupported };
  Lock try_lock();
  void sync();
  void close();

 private:
  int fd_ = -1;
  std::string path_;
};

/// Joins directory and name with one '/'.
std::string join_path(const std::string& dir, const std::string& name);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
/// mkdir -p; throws on failure.
void create_directories(const std::string& path);
/// rename(2); throws on failure.
void rename_file(const std::string& from, const std::string& to);
/// unlink(2); returns false when the file did not exist, throws on other errors.
bool remove_file(const std::string& path);
/// unlink(2) on a failure path, where the failure being handled is the one to report:
/// errors are ignored.
void remove_file_quietly(const std::string& path) noexcept;
/// rmdir(2) of an empty directory; returns false when it did not exist, throws on other errors.
bool remove_directory(const std::string& path);
/// fsync of a directory, so that renames and creations in it are durable.
void sync_directory(const std::string& dir);
/// Whole-file read; throws when the file holds more than `max_bytes`.
std::string read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);
/// Names in a directory (no "." or "..").
std::vector<std::string> list_directory(const std::string& dir);

}  // namespace dcp::detail
