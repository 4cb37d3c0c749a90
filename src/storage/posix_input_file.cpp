// PosixInputFile (see posix_input_file.h).
#include "storage/posix_input_file.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "storage/paths.h"

namespace dcp::detail {
namespace {

File open_data_file(const std::string& dir, const std::string& relative) {
  paths::check_relative_name(relative);
  return File::open_regular_inside(dir, relative);
}

}  // namespace

PosixInputFile::PosixInputFile(const std::string& dir, const std::string& relative)
    : name_(relative), file_(open_data_file(dir, relative)), size_(file_.size()) {}

void PosixInputFile::read(uint64_t offset, void* dst, size_t n) const {
  TORCH_CHECK(offset <= size_ && n <= size_ - offset, "reading '", paths::printable(name_),
              "' bytes [", offset, ", ", offset + n, "): file has ", size_, " bytes (truncated?)");
  file_.pread_all(dst, n, offset);
}

void PosixInputFile::prefetch(uint64_t offset, uint64_t n) const {
  if (offset < size_) file_.advise_willneed(offset, std::min(n, size_ - offset));
}

}  // namespace dcp::detail
