// POSIX file helpers (see file.h). Every errno becomes an exception in throw_errno. Each
// operation that changes the file system first asks the fault-injection seam
// (io/fault_injection.h), which is idle outside tests.
#include "io/file.h"

#include <c10/util/Exception.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cerrno>
#include <cstring>

#include "io/fault_injection.h"

namespace dcp::detail {

void throw_errno(const std::string& op, const std::string& path, int err) {
  TORCH_CHECK(false, op, " '", path, "': ", std::strerror(err), " (errno ", err, ")");
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// open(2) with O_CLOEXEC, retried on EINTR: the descriptor, or -1 with errno set.
int open_retrying(const std::string& path, int flags, mode_t mode) {
  if ((flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0) {
    if (const int err = inject_fault(FileOp::kOpen, path); err != 0) {
      errno = err;
      return -1;
    }
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// write(2) until all n bytes are out, retried on EINTR. Returns 0, or the errno that stopped
// it; *written counts the bytes that went out either way.
int write_fully(int fd, const std::string& path, const void* data, size_t n, size_t* written) {
  const char* p = static_cast<const char*>(data);
  *written = 0;
  if (const int err = inject_fault(FileOp::kWrite, path); err != 0) return err;
  while (*written < n) {
    const ssize_t w = ::write(fd, p + *written, n - *written);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    *written += static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

File File::open(const std::string& path, int flags, mode_t mode) {
  const int fd = open_retrying(path, flags, mode);
  if (fd < 0) throw_errno("opening", path, errno);
  return File(fd, path);
}

File::Lock File::try_lock() {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // the whole file
  int rc;
  do {
    rc = ::fcntl(fd_, F_OFD_SETLK, &fl);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Lock::kLocked;
  if (errno == EAGAIN || errno == EACCES) return Lock::kBusy;
  if (errno == ENOLCK || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    return Lock::kUnsupported;
  }
  throw_errno("locking", path_, errno);
}

File File::open_regular_inside(const std::string& dir, const std::string& relative) {
  const std::string path = join_path(dir, relative);
  // O_NONBLOCK: opening a FIFO must not wait for a writer; regular files ignore it.
  const int fd = open_retrying(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
  if (fd < 0) throw_errno("opening", path, errno);
  File file(fd, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("stat of", path, errno);
  TORCH_CHECK(S_ISREG(st.st_mode), "'", path, "' is not a regular file: a checkpoint's data ",
              "files are");
  char real_dir[PATH_MAX], real_file[PATH_MAX];
  if (::realpath(dir.c_str(), real_dir) == nullptr) throw_errno("resolving", dir, errno);
  if (::realpath(path.c_str(), real_file) == nullptr) throw_errno("resolving", path, errno);
  const std::string inside = std::string(real_dir) + "/";
  TORCH_CHECK(std::string(real_file).compare(0, inside.size(), inside) == 0, "'", path,
              "' resolves to '", real_file, "', outside the checkpoint directory '", real_dir,
              "'");
  return file;
}

std::optional<File> File::open_direct(const std::string& path, int flags, mode_t mode) {
  const int fd = open_retrying(path, flags | O_DIRECT, mode);
  if (fd < 0 && errno == EINVAL) return std::nullopt;
  if (fd < 0) throw_errno("opening", path, errno);
  return File(fd, path);
}

bool File::write_all_direct(const void* data, size_t n) {
  size_t written = 0;
  const int err = write_fully(fd_, path_, data, n, &written);
  if (err == EINVAL && written == 0) return false;
  if (err != 0) throw_errno("writing (O_DIRECT)", path_, err);
  return true;
}

void File::clear_direct() {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
    throw_errno("turning off O_DIRECT on", path_, errno);
  }
}

bool File::preallocate(uint64_t bytes) {
  if (bytes == 0) return true;
  int r;
  if (const int err = inject_fault(FileOp::kFallocate, path_); err != 0) {
    r = -1;
    errno = err;
  } else {
    do {
      r = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
    } while (r != 0 && errno == EINTR);
  }
  if (r == 0) return true;
  if (errno == EOPNOTSUPP || errno == ENOSYS) return false;
  throw_errno("allocating " + std::to_string(bytes) + " bytes for", path_, errno);
}

void File::truncate(uint64_t size) {
  if (const int err = inject_fault(FileOp::kTruncate, path_); err != 0) {
    throw_errno("truncating", path_, err);
  }
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) throw_errno("truncating", path_, errno);
}

void File::write_all(const void* data, size_t n) {
  size_t written = 0;
  if (const int err = write_fully(fd_, path_, data, n, &written); err != 0) {
    throw_errno("writing", path_, err);
  }
}

void File::pread_all(void* data, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  uint64_t pos = offset;
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(pos));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("reading", path_, errno);
    }
    TORCH_CHECK(r > 0, "reading '", path_, "' bytes [", offset, ", ", pos + n,
                "): the file ends at byte ", pos, " (truncated?)");
    p += r;
    pos += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

void File::advise_willneed(uint64_t offset, uint64_t n) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n),
                        POSIX_FADV_WILLNEED);
}

uint64_t File::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_errno("stat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::sync() {
  if (const int err = inject_fault(FileOp::kFsync, path_); err != 0) {
    throw_errno("fsync", path_, err);
  }
  if (::fsync(fd_) != 0) throw_errno("fsync", path_, errno);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) throw_errno("closing", path_, errno);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void create_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const auto slash = path.find_last_of('/', path.size() > 1 ? path.size() - 2 : 0);
  if (slash != std::string::npos && slash > 0) create_directories(path.substr(0, slash));
  if (const int err = inject_fault(FileOp::kMkdir, path); err != 0) {
    throw_errno("creating directory", path, err);
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw_errno("creating directory", path, errno);
  }
}

void rename_file(const std::string& from, const std::string& to) {
  if (const int err = inject_fault(FileOp::kRename, from); err != 0) {
    throw_errno("renaming to '" + to + "'", from, err);
  }
  if (::rename(from.c_str(), to.c_str()) != 0) throw_errno("renaming to '" + to + "'", from, errno);
}

bool remove_file(const std::string& path) {
  if (const int err = inject_fault(FileOp::kUnlink, path); err != 0) {
    throw_errno("removing", path, err);
  }
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw_errno("removing", path, errno);
}

bool remove_directory(const std::string& path) {
  if (::rmdir(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw_errno("removing the directory", path, errno);
}

void remove_file_quietly(const std::string& path) noexcept {
  if (inject_fault(FileOp::kUnlink, path) != 0) return;
  (void)::unlink(path.c_str());
}

void sync_directory(const std::string& dir) {
  File d = File::open(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
  d.sync();
  d.close();
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  File f = File::open(path, O_RDONLY);
  const uint64_t size = f.size();
  TORCH_CHECK(size <= max_bytes, "'", path, "' holds ", size, " bytes, more than the ", max_bytes,
              " such a file can have");
  std::string data(size, '\0');
  f.pread_all(data.data(), data.size(), 0);
  return data;
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw_errno("listing", dir, errno);
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(d);
  return names;
}

}  // namespace dcp::detail
