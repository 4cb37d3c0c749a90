// FileSystemReader: reads a checkpoint directory written by dcp or Python DCP.
//
//   read_metadata: '.metadata' through the restricted pickle reader, checked against its
//                  checksum sidecar (storage/metadata_file.h); a directory without it is
//                  reported as "no checkpoint" (or "incomplete" when data files are there).
//   read_data:     the shared read path (read_items.h) over pread-based files.
#include <c10/util/Exception.h>
#include <fcntl.h>

#include <algorithm>

#include "dcp/filesystem.h"
#include "storage/metadata_file.h"
#include "storage/read_items.h"
#include "storage/posix_input_file.h"

namespace dcp {
FileSystemReader::FileSystemReader(std::string path, FileSystemReaderOptions options)
    : path_(std::move(path)), options_(options) {
  TORCH_CHECK(options_.thread_count >= 1, "FileSystemReader: thread_count must be >= 1");
}

FileSystemReader::~FileSystemReader() = default;

void FileSystemReader::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) path_ = *checkpoint_id;
  metadata_ = nullptr;
}

Metadata FileSystemReader::read_metadata() {
  return detail::read_metadata_file(path_, options_.verify_crc32).metadata;
}

void FileSystemReader::set_up_storage_reader(const Metadata& metadata, bool is_coordinator,
                                             int rank) {
  metadata_ = &metadata;
}

LoadPlan FileSystemReader::prepare_local_plan(LoadPlan plan) { return plan; }

std::vector<LoadPlan> FileSystemReader::prepare_global_plan(std::vector<LoadPlan> plans) {
  return plans;
}

std::future<void> FileSystemReader::read_data(const LoadPlan& plan, LoadPlanner& planner) {
  return detail::read_data(
      plan, planner, metadata_,
      [this](const std::string& relative) {
        return std::make_shared<detail::PosixInputFile>(path_, relative);
      },
      detail::ReadOptions{options_.thread_count, options_.ranged_reads, options_.prefetch_bytes,
                          options_.verify_crc32});
}

}  // namespace dcp
