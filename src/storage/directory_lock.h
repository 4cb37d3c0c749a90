// DirectoryLock: the lock a save holds on its checkpoint directory from planning through commit
// (Note [Re-save] in filesystem_writer.cpp), so that of two saves into one directory at the
// same time the second fails before writing. Move-only RAII; the lock file exists only while
// held, so the directory keeps Python DCP's layout.
#pragma once

#include <memory>
#include <string>

namespace dcp::detail {

class File;

class DirectoryLock {
 public:
  /// Takes the lock of `dir` without waiting; throws, naming the directory, when another save
  /// holds it. Where the file system has no locks, warns once and returns an empty lock.
  static DirectoryLock acquire(const std::string& dir);

  DirectoryLock();
  DirectoryLock(DirectoryLock&&) noexcept;
  DirectoryLock& operator=(DirectoryLock&&) noexcept;
  ~DirectoryLock();  // release()

  /// Removes the lock file, then unlocks. Never throws.
  void release();

 private:
  std::unique_ptr<File> file_;
  std::string path_;
};

}  // namespace dcp::detail
