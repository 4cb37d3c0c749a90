// DirectoryLock (see directory_lock.h).
//
// The lock is an open-file-description lock on '<dir>/.dcp_lock' (File::try_lock; released if
// the process dies). The holder removes the file before unlocking, so a saver that opened the
// file just before the removal may lock an inode that no longer has the name; after locking,
// every saver therefore checks that the name still refers to the inode it locked, and starts
// over when it does not.
#include "storage/directory_lock.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <utility>

#include "io/file.h"
#include "storage/paths.h"

namespace dcp::detail {

DirectoryLock::DirectoryLock() = default;
DirectoryLock::DirectoryLock(DirectoryLock&&) noexcept = default;
DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    release();
    file_ = std::move(other.file_);
    path_ = std::move(other.path_);
  }
  return *this;
}
DirectoryLock::~DirectoryLock() { release(); }

DirectoryLock DirectoryLock::acquire(const std::string& dir) {
  const std::string path = join_path(dir, paths::lock_file());
  for (int attempt = 0; attempt < 8; ++attempt) {
    auto file = std::make_unique<File>(File::open(path, O_RDWR | O_CREAT));
    switch (file->try_lock()) {
      case File::Lock::kBusy:
        TORCH_CHECK(false, "another save is writing checkpoint '", dir, "' (it holds '", path,
                    "'): of two saves into one directory at the same time only one may commit");
      case File::Lock::kUnsupported:
        TORCH_WARN_ONCE("the file system of '", dir, "' has no file locks: dcp cannot refuse a ",
                        "second save into this directory while one is running");
        return DirectoryLock();
      case File::Lock::kLocked:
        break;
    }
    struct stat by_name {}, locked {};
    if (::stat(path.c_str(), &by_name) == 0 && ::fstat(file->fd(), &locked) == 0 &&
        by_name.st_dev == locked.st_dev && by_name.st_ino == locked.st_ino) {
      DirectoryLock lock;
      lock.file_ = std::move(file);
      lock.path_ = path;
      return lock;
    }
    // The holder before us removed the file after we opened it: try the current one.
  }
  TORCH_CHECK(false, "could not lock '", path, "': it keeps being replaced");
}

void DirectoryLock::release() {
  if (!file_) return;
  try {
    remove_file(path_);
  } catch (const c10::Error& e) {
    TORCH_WARN("could not remove the lock file '", path_, "': ", e.what_without_backtrace());
  }
  file_.reset();  // closing the descriptor unlocks
}

}  // namespace dcp::detail
