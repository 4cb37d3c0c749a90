// FileSystemWriter: writes a checkpoint directory in PyTorch DCP's layout.
//
// Commit protocol (also in docs/format.md):
//   1. prepare_local_plan (every rank): create the directory; refuse an existing checkpoint
//      when overwrite is false.
//   2. prepare_global_plan (coordinator): lock the directory ('.dcp_lock', held until the
//      commit ends); assign each rank its file prefix: Python's "__{rank}_" in a directory
//      without a checkpoint, "__{rank}_{token}_" (unique to this save) where one exists.
//   3. write_data (every rank): write '{prefix}{k}.distcp' under final names, fsync each; a
//      rank that fails removes the files it was writing.
//   4. finish (coordinator): write '.metadata.tmp' (streamed from the encoder, with
//      direct_io through DirectFileOutput as the data files are), fsync; write
//      '.metadata.checksum.tmp', fsync, rename to '.metadata.checksum' (Note [Metadata
//      checksum]); rename '.metadata.tmp' to '.metadata', fsync the directory. Until this
//      rename the new checkpoint does not exist and the old one, if any, is intact. Then
//      remove the data files the new '.metadata' does not reference, fsync the directory,
//      release the lock.
//
// Note [Re-save]: a save into a directory that already holds a checkpoint must not touch that
// checkpoint's files before it commits: a save that is killed or runs out of space would
// otherwise leave no loadable checkpoint (Python rewrites the data files in place while the
// old '.metadata' points into them; an earlier dcp removed the old '.metadata' first). So the
// new data files get names unique to the save (Python reads whatever storage_data names), the
// rename of '.metadata' switches from the old checkpoint to the new one atomically, and only
// then are the old files removed. Two saves into one directory at once would remove each
// other's files; the lock makes the second one fail before any rank writes. Files left by a
// save that died (its own data files, a '.metadata.tmp') are unreferenced and removed by the
// next save that commits there. When the fsync of the directory right after the rename fails,
// the save reports it and keeps the old files: whether the rename is durable is unknown, and
// after a power loss the old '.metadata' could be back. tests/fault_injection_test.cpp fails
// and crashes a save at each of its file operations in turn.
#include <c10/util/Exception.h>
#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "dcp/filesystem.h"
#include "format/metadata_checksum.h"
#include "format/metadata_codec.h"
#include "io/file.h"
#include "storage/file_output.h"
#include "storage/directory_lock.h"
#include "storage/metadata_file.h"
#include "storage/paths.h"
#include "storage/write_items.h"
#include "util/uuid.h"

namespace dcp {
namespace {

// About what a bucket's records take: the tensors' bytes plus a record's headers and padding.
detail::ItemEncoding encoding_of(const FileSystemWriterOptions& options) {
  return detail::ItemEncoding{options.compression == Compression::kZstd, options.zstd_level};
}

uint64_t expected_bytes(const detail::FileBucket& bucket) {
  constexpr uint64_t kRecordOverhead = 4096;
  uint64_t bytes = 0;
  for (const WriteItem* item : bucket.items) {
    bytes += static_cast<uint64_t>(item->tensor_storage_size()) + kRecordOverhead;
  }
  return bytes;
}

// After a commit (Note [Re-save]): removes the data files among `names` (in `dir`) that
// `metadata` does not reference. One that cannot be removed is a warning that starts with
// `committed`: the save has succeeded. Returns whether a file was removed.
bool remove_unreferenced_files(const std::string& dir, const std::vector<std::string>& names,
                               const Metadata& metadata, const std::vector<std::string>& prefixes,
                               const std::string& committed) {
  bool removed = false;
  for (const std::string& name : detail::unreferenced_data_files(names, metadata, prefixes)) {
    try {
      removed = detail::remove_file(detail::join_path(dir, name)) || removed;
    } catch (const c10::Error& e) {
      TORCH_WARN(committed, ", but an unreferenced data file stays: ", e.what_without_backtrace());
    }
  }
  return removed;
}

}  // namespace

FileSystemWriter::FileSystemWriter(std::string path, FileSystemWriterOptions options)
    : path_(std::move(path)), options_(options), save_id_(detail::uuid4()) {
  TORCH_CHECK(options_.thread_count >= 1, "FileSystemWriter: thread_count must be >= 1");
}

FileSystemWriter::~FileSystemWriter() = default;

void FileSystemWriter::reset(const std::optional<std::string>& checkpoint_id) {
  lock_.reset();
  if (checkpoint_id) path_ = *checkpoint_id;
  save_id_ = detail::uuid4();
}

void FileSystemWriter::set_up_storage_writer(bool is_coordinator, int rank) {
  is_coordinator_ = is_coordinator;
  rank_local_.reset();
  std::lock_guard<std::mutex> lock(written_mu_);
  written_.clear();
}

// Note [Saving without collectives]: as Python's FileSystemWriter with use_collectives=False,
// the rank writes its data files with its own prefix "__{rank}_" and commits its own
// "__{rank}.metadata" (temporary name, fsync, rename), describing only what it wrote. There is
// no directory lock (every rank commits) and no checksum file; a re-save of the rank replaces
// its metadata and then removes its own previous data files. The checkpoint as a whole is not
// atomic: no rank knows when the others commit (dcp::save ends with a collective that reports
// every rank's outcome). Loads merge the ranks' files (Note [Rank-local metadata]).
void FileSystemWriter::set_up_storage_writer_without_collectives(int rank) {
  is_coordinator_ = true;
  rank_local_ = rank;
  std::lock_guard<std::mutex> lock(written_mu_);
  written_.clear();
}

SavePlan FileSystemWriter::prepare_local_plan(SavePlan plan) {
  TORCH_CHECK(!path_.empty(), "FileSystemWriter: no checkpoint path (pass a checkpoint_id)");
  detail::create_directories(path_);
  const std::string metadata = detail::join_path(path_, detail::paths::metadata_file());
  if (rank_local_) {  // Note [Saving without collectives]
    TORCH_CHECK(!detail::path_exists(metadata), "'", path_, "' holds a checkpoint saved with ",
                "collectives ('", detail::paths::metadata_file(), "'), which loads would read ",
                "instead of a save without collectives: use another directory");
    const std::string own = detail::join_path(path_, detail::paths::rank_metadata_file(*rank_local_));
    TORCH_CHECK(options_.overwrite || !detail::path_exists(own), "checkpoint '", path_,
                "' already exists and overwrite is false");
    return plan;
  }
  TORCH_CHECK(options_.overwrite || !detail::path_exists(metadata), "checkpoint '", path_,
              "' already exists and overwrite is false");
  return plan;
}

std::vector<SavePlan> FileSystemWriter::prepare_global_plan(std::vector<SavePlan> plans) {
  if (rank_local_) {  // Note [Saving without collectives]
    TORCH_CHECK(plans.size() == 1, "a save without collectives plans one rank, got ",
                plans.size(), " plans");
    const bool resave = detail::path_exists(
        detail::join_path(path_, detail::paths::rank_metadata_file(*rank_local_)));
    plans[0].storage_data = detail::paths::rank_prefix(
        *rank_local_, resave ? detail::paths::save_token(save_id_) : "");
    prefixes_ = {plans[0].storage_data};
    return plans;
  }
  // Note [Re-save]
  lock_.reset();
  lock_ = std::make_unique<detail::DirectoryLock>(detail::DirectoryLock::acquire(path_));
  const bool resave = detail::path_exists(detail::join_path(path_, detail::paths::metadata_file()));
  const std::string token = resave ? detail::paths::save_token(save_id_) : "";
  prefixes_.clear();
  for (size_t i = 0; i < plans.size(); ++i) {
    plans[i].storage_data = detail::paths::rank_prefix(static_cast<int>(i), token);
    prefixes_.push_back(plans[i].storage_data);
  }
  return plans;
}

std::future<std::vector<WriteResult>> FileSystemWriter::write_data(const SavePlan& plan,
                                                                   SavePlanner& planner) {
  return detail::write_files(plan, options_.single_file_per_rank, options_.thread_count,
                             [&](const detail::FileBucket& bucket) {
                               const std::string file_path =
                                   detail::join_path(path_, bucket.relative_path);
                               try {
                                 auto results = write_file(file_path, bucket, planner);
                                 std::lock_guard<std::mutex> lock(written_mu_);
                                 written_.push_back(bucket.relative_path);
                                 return results;
                               } catch (...) {
                                 detail::remove_file_quietly(file_path);  // no partial file stays
                                 throw;
                               }
                             });
}

std::vector<WriteResult> FileSystemWriter::write_file(const std::string& file_path,
                                                      const detail::FileBucket& bucket,
                                                      SavePlanner& planner) {
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
    results = detail::write_bucket(bucket, planner, out, encoding_of(options_));
    out.finish();
    if (preallocated) file->truncate(out.position());
  } else {
    file = detail::File::open(file_path, flags);
    detail::BufferedFileOutput out(*file);
    results = detail::write_bucket(bucket, planner, out, encoding_of(options_));
    out.finish();
  }
  if (options_.sync_files) file->sync();
  file->close();
  return results;
}

void FileSystemWriter::finish(const Metadata& metadata,
                              const std::vector<std::vector<WriteResult>>& results) {
  if (rank_local_) {  // Note [Saving without collectives]
    commit_metadata(detail::paths::rank_metadata_temp_file(*rank_local_),
                    detail::paths::rank_metadata_file(*rank_local_), metadata,
                    /*with_checksum=*/false);
    if (options_.sync_files) detail::sync_directory(path_);
    const std::string mine = detail::paths::rank_prefix(*rank_local_);
    std::vector<std::string> own_files;
    for (const std::string& name : detail::list_directory(path_)) {
      if (name.compare(0, mine.size(), mine) == 0) own_files.push_back(name);
    }
    remove_unreferenced_files(path_, own_files, metadata, prefixes_,
                              c10::str("rank ", *rank_local_, " committed to '", path_, "'"));
    return;
  }
  try {
    commit_metadata(detail::paths::metadata_temp_file(), detail::paths::metadata_file(), metadata,
                    /*with_checksum=*/true);
  } catch (...) {
    lock_.reset();
    throw;
  }
  if (options_.sync_files) detail::sync_directory(path_);
  // Note [Re-save]: committed; the previous checkpoint's files are garbage only now. A file
  // that cannot be removed is reported, but the save has succeeded.
  const bool removed =
      remove_unreferenced_files(path_, detail::list_directory(path_), metadata, prefixes_,
                                c10::str("checkpoint '", path_, "' committed"));
  if (removed && options_.sync_files) detail::sync_directory(path_);
  lock_.reset();
}

// Streams `metadata` into `tmp_name` (the pickle is never whole in memory: at 2 million
// entries it is 223 MiB), then, `with_checksum`, replaces the checksum sidecar with that
// file's, and renames `tmp_name` to `final_name`: the commit. Names are in the directory.
// Note [Metadata checksum]: the sidecar goes after the new bytes are on disk and before the
// rename, so a failure while writing them leaves the previous checkpoint's sidecar in place;
// without a save id the sidecar could not tell a corrupt '.metadata' from a stale one, so
// none is written. A failure removes the temporary file and rethrows.
void FileSystemWriter::commit_metadata(const std::string& tmp_name, const std::string& final_name,
                                       const Metadata& metadata, bool with_checksum) {
  const std::string tmp = detail::join_path(path_, tmp_name);
  const detail::MetadataChecksum written =
      detail::write_metadata_file(tmp, metadata, {options_.sync_files, options_.direct_io});
  try {
    if (with_checksum && !written.save_id.empty()) {
      replace_file(detail::paths::metadata_checksum_temp_file(),
                   detail::paths::metadata_checksum_file(),
                   detail::encode_metadata_checksum(written));
    } else if (with_checksum) {
      detail::remove_file(detail::join_path(path_, detail::paths::metadata_checksum_file()));
    }
    detail::rename_file(tmp, detail::join_path(path_, final_name));
  } catch (...) {
    detail::remove_file_quietly(tmp);  // the commit's own error is the one to report
    throw;
  }
}

// Writes `bytes` to `tmp`, fsyncs it and renames it to `final_name` (names in the directory);
// a failure removes `tmp` and rethrows.
void FileSystemWriter::replace_file(const std::string& tmp_name, const std::string& final_name,
                                    const std::string& bytes) {
  const std::string tmp = detail::join_path(path_, tmp_name);
  try {
    detail::File file = detail::File::open(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    file.write_all(bytes.data(), bytes.size());
    if (options_.sync_files) file.sync();
    file.close();
    detail::rename_file(tmp, detail::join_path(path_, final_name));
  } catch (...) {
    detail::remove_file_quietly(tmp);  // the commit's own error is the one to report
    throw;
  }
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
  detail::File file =
      detail::File::open(detail::join_path(path_, name), O_WRONLY | O_CREAT | O_TRUNC);
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

// Note [Re-save]: what this rank wrote is garbage unless a committed '.metadata' references it
// (a failure reported after the rename, a directory fsync say, must not cost the checkpoint).
void FileSystemWriter::abort() {
  lock_.reset();
  std::vector<std::string> written;
  {
    std::lock_guard<std::mutex> lock(written_mu_);
    written.swap(written_);
  }
  if (written.empty()) return;
  try {
    Metadata committed;
    const std::string metadata = detail::join_path(
        path_, rank_local_ ? detail::paths::rank_metadata_file(*rank_local_)
                           : detail::paths::metadata_file());
    if (detail::path_exists(metadata)) {
      const std::string bytes = detail::read_file(metadata);
      committed = detail::decode_metadata(bytes.data(), bytes.size(), "'" + metadata + "'");
    }
    for (const std::string& name :
         detail::unreferenced_data_files(written, committed, /*own_prefixes=*/{})) {
      detail::remove_file(detail::join_path(path_, name));
    }
  } catch (const c10::Error& e) {
    TORCH_WARN("after a failed save into '", path_, "', some of its data files stay: ",
               e.what_without_backtrace());
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
