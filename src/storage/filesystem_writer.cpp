// FileSystemWriter: writes a checkpoint directory in PyTorch DCP's layout.
//
// Commit protocol (also in docs/format.md):
//   1. prepare_local_plan (every rank): create the directory; refuse an existing checkpoint
//      when overwrite is false.
//   2. prepare_global_plan (coordinator): if a '.metadata' exists, remove it and fsync the
//      directory before any rank rewrites data files (Note [Invalidate before overwrite]);
//      assign each rank its file prefix "__{rank}_".
//   3. write_data (every rank): write '__{rank}_{k}.distcp' under final names, fsync each.
//   4. finish (coordinator): write '.metadata.tmp', fsync, rename to '.metadata', fsync the
//      directory. Until this rename the new checkpoint does not exist.
//
// Note [Invalidate before overwrite]: Python DCP rewrites data files in place while the old
// '.metadata' still points into them, so a re-save that fails midway leaves a '.metadata' that
// describes bytes no longer there. Removing the old metadata first means such a failure leaves
// no checkpoint in that directory, never a corrupt one. Checkpoints in other directories are
// never touched.
#include <c10/util/Exception.h>
#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "dcp/filesystem.h"
#include "format/metadata_codec.h"
#include "io/file.h"
#include "storage/file_output.h"
#include "storage/write_items.h"
#include "storage/paths.h"

namespace dcp {
namespace {

std::string uuid4() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  uint8_t b[16];
  for (int i = 0; i < 16; i += 8) {
    const uint64_t v = gen();
    std::memcpy(b + i, &v, 8);
  }
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}

// About what a bucket's records take: the tensors' bytes plus a record's headers and padding.
uint64_t expected_bytes(const detail::FileBucket& bucket) {
  constexpr uint64_t kRecordOverhead = 4096;
  uint64_t bytes = 0;
  for (const WriteItem* item : bucket.items) {
    bytes += static_cast<uint64_t>(item->tensor_storage_size()) + kRecordOverhead;
  }
  return bytes;
}

}  // namespace

FileSystemWriter::FileSystemWriter(std::string path, FileSystemWriterOptions options)
    : path_(std::move(path)), options_(options), save_id_(uuid4()) {
  TORCH_CHECK(options_.thread_count >= 1, "FileSystemWriter: thread_count must be >= 1");
}

FileSystemWriter::~FileSystemWriter() = default;

void FileSystemWriter::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) path_ = *checkpoint_id;
  save_id_ = uuid4();
}

void FileSystemWriter::set_up_storage_writer(bool is_coordinator, int rank) {
  is_coordinator_ = is_coordinator;
}

SavePlan FileSystemWriter::prepare_local_plan(SavePlan plan) {
  TORCH_CHECK(!path_.empty(), "FileSystemWriter: no checkpoint path (pass a checkpoint_id)");
  detail::create_directories(path_);
  const std::string metadata = detail::join_path(path_, detail::paths::metadata_file());
  TORCH_CHECK(options_.overwrite || !detail::path_exists(metadata), "checkpoint '", path_, "' already exists and overwrite is false");
  return plan;
}

std::vector<SavePlan> FileSystemWriter::prepare_global_plan(std::vector<SavePlan> plans) {
  // Note [Invalidate before overwrite]
  if (detail::remove_file(detail::join_path(path_, detail::paths::metadata_file()))) {
    detail::sync_directory(path_);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    plans[i].storage_data = detail::paths::rank_prefix(static_cast<int>(i));
  }
  return plans;
}

std::future<std::vector<WriteResult>> FileSystemWriter::write_data(const SavePlan& plan,
                                                                   SavePlanner& planner) {
  return detail::write_files(
      plan, options_.single_file_per_rank, options_.thread_count,
      [&](const detail::FileBucket& bucket) {
        const std::string file_path = detail::join_path(path_, bucket.relative_path);
        const int flags = O_WRONLY | O_CREAT | O_TRUNC;
        // O_DIRECT where asked for and the file system allows it, else buffered.
        std::optional<detail::File> file;
        if (options_.direct_io) file = detail::File::open_direct(file_path, flags);
        std::vector<WriteResult> results;
        if (file) {
          // O_DIRECT allocates blocks as each write lands: ranks writing at once would
          // interleave their files on disk in buffer-sized pieces, which later reads pay for.
          // So the file's expected size is allocated first and trimmed to what was written.
          const bool preallocated = file->preallocate(expected_bytes(bucket));
          detail::DirectFileOutput out(*file);
          results = detail::write_bucket(bucket, planner, out);
          out.finish();
          if (preallocated) file->truncate(out.position());
        } else {
          file = detail::File::open(file_path, flags);
          detail::BufferedFileOutput out(*file);
          results = detail::write_bucket(bucket, planner, out);
          out.finish();
        }
        if (options_.sync_files) file->sync();
        file->close();
        return results;
      });
}

void FileSystemWriter::finish(const Metadata& metadata,
                              const std::vector<std::vector<WriteResult>>& results) {
  const std::string bytes = detail::encode_metadata(metadata);
  const std::string tmp = detail::join_path(path_, detail::paths::metadata_temp_file());
  const std::string final_path = detail::join_path(path_, detail::paths::metadata_file());
  detail::File file = detail::File::open(tmp, O_WRONLY | O_CREAT | O_TRUNC);
  file.write_all(bytes.data(), bytes.size());
  if (options_.sync_files) file.sync();
  file.close();
  detail::rename_file(tmp, final_path);
  if (options_.sync_files) detail::sync_directory(path_);
}

// The probe holds the coordinator's save id; a rank sees it when it can open the file in its
// own checkpoint directory and read that id back. Shared file systems with close-to-open
// consistency (NFS) show a closed file to every client that opens it afterwards; a few retries
// cover slower metadata propagation.
std::string FileSystemWriter::create_visibility_probe() {
  if (!options_.check_shared_directory) return "";
  TORCH_CHECK(!path_.empty(), "FileSystemWriter: no checkpoint path (pass a checkpoint_id)");
  detail::create_directories(path_);
  const std::string name = detail::paths::probe_file(save_id_);
  detail::File file = detail::File::open(detail::join_path(path_, name), O_WRONLY | O_CREAT | O_TRUNC);
  file.write_all(save_id_.data(), save_id_.size());
  file.sync();
  file.close();
  return name + ":" + save_id_;
}

bool FileSystemWriter::sees_visibility_probe(const std::string& probe) {
  const auto colon = probe.find(':');
  TORCH_CHECK(colon != std::string::npos, "malformed visibility probe '", probe, "'");
  const std::string path = detail::join_path(path_, probe.substr(0, colon));
  const std::string expected = probe.substr(colon + 1);
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (detail::path_exists(path)) {
      try {
        if (detail::read_file(path) == expected) return true;
      } catch (const c10::Error&) {
        // Not readable (yet); retry.
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 << attempt));
  }
  return false;
}

void FileSystemWriter::remove_visibility_probe(const std::string& probe) {
  const auto colon = probe.find(':');
  if (colon != std::string::npos) {
    detail::remove_file(detail::join_path(path_, probe.substr(0, colon)));
  }
}

std::string FileSystemWriter::visibility_probe_advice() {
  return "Every rank must write to one shared file system (NFS, Lustre, ...): a checkpoint "
         "spread over node-local disks cannot be loaded by any other job. Set "
         "FileSystemWriterOptions::check_shared_directory = false to skip this check.";
}

std::optional<StorageMeta> FileSystemWriter::storage_meta() {
  StorageMeta meta;
  meta.checkpoint_id = path_;
  meta.save_id = save_id_;
  return meta;
}

}  // namespace dcp
