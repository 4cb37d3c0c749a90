// PosixInputFile: a data file of a checkpoint directory, read with pread. Its name comes from
// a '.metadata', so it is opened only as a plain relative name of a regular file inside the
// directory (paths::check_relative_name, File::open_regular_inside).
#pragma once

#include <cstdint>
#include <string>

#include "io/file.h"
#include "storage/read_items.h"

namespace dcp::detail {

/// Thread-safe: pread from several IO threads.
class PosixInputFile : public InputFile {
 public:
  /// Throws naming `relative` when it is not a regular file inside `dir`.
  PosixInputFile(const std::string& dir, const std::string& relative);
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* dst, size_t n) const override;
  void prefetch(uint64_t offset, uint64_t n) const override;

 private:
  std::string name_;
  File file_;
  uint64_t size_;
};

}  // namespace dcp::detail
