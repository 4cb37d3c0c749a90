// In-memory storage: the same files as FileSystemWriter produces, kept in a MemoryStorage.
#include "dcp/memory_storage.h"

#include <c10/util/Exception.h>

#include "format/metadata_codec.h"
#include "storage/read_items.h"
#include "storage/write_items.h"
#include "util/uuid.h"
#include "storage/paths.h"

namespace dcp {
namespace {

class StringOutput : public detail::OutputStream {
 public:
  void write(const void* data, size_t n) override {
    bytes.append(static_cast<const char*>(data), n);
  }
  uint64_t position() const override { return bytes.size(); }
  std::string bytes;
};

class StringInputFile : public detail::InputFile {
 public:
  StringInputFile(std::string name, std::shared_ptr<const std::string> bytes)
      : name_(std::move(name)), bytes_(std::move(bytes)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_->size(); }
  void read(uint64_t offset, void* dst, size_t n) const override {
    TORCH_CHECK(offset <= bytes_->size() && n <= bytes_->size() - offset, "reading '", name_,
                "' bytes [", offset, ", ", offset + n, "): file has ", bytes_->size(),
                " bytes (truncated?)");
    std::memcpy(dst, bytes_->data() + offset, n);
  }

 private:
  std::string name_;
  std::shared_ptr<const std::string> bytes_;
};

}  // namespace

void MemoryStorage::put(const std::string& checkpoint_id, const std::string& name,
                        std::string bytes) {
  auto shared = std::make_shared<const std::string>(std::move(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  files_[checkpoint_id][name] = std::move(shared);
}

std::optional<std::shared_ptr<const std::string>> MemoryStorage::get(
    const std::string& checkpoint_id, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto c = files_.find(checkpoint_id);
  if (c == files_.end()) return std::nullopt;
  auto f = c->second.find(name);
  if (f == c->second.end()) return std::nullopt;
  return f->second;
}

bool MemoryStorage::remove(const std::string& checkpoint_id, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto c = files_.find(checkpoint_id);
  return c != files_.end() && c->second.erase(name) > 0;
}

std::vector<std::string> MemoryStorage::list(const std::string& checkpoint_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  auto c = files_.find(checkpoint_id);
  if (c != files_.end()) {
    for (const auto& [name, bytes] : c->second) names.push_back(name);
  }
  return names;
}

MemoryWriter::MemoryWriter(MemoryStorage& storage, std::string checkpoint_id,
                           MemoryWriterOptions options)
    : storage_(storage), checkpoint_id_(std::move(checkpoint_id)), options_(options) {}

void MemoryWriter::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) checkpoint_id_ = *checkpoint_id;
}

void MemoryWriter::set_up_storage_writer(bool is_coordinator, int rank) {}

SavePlan MemoryWriter::prepare_local_plan(SavePlan plan) { return plan; }

std::vector<SavePlan> MemoryWriter::prepare_global_plan(std::vector<SavePlan> plans) {
  // As FileSystemWriter (Note [Re-save]): a checkpoint already there keeps its files until the
  // new one commits, so the new files get names unique to this save.
  const bool resave = storage_.get(checkpoint_id_, detail::paths::metadata_file()).has_value();
  const std::string token = resave ? detail::paths::save_token(detail::uuid4()) : "";
  prefixes_.clear();
  for (size_t i = 0; i < plans.size(); ++i) {
    plans[i].storage_data = detail::paths::rank_prefix(static_cast<int>(i), token);
    prefixes_.push_back(plans[i].storage_data);
  }
  return plans;
}

std::future<std::vector<WriteResult>> MemoryWriter::write_data(const SavePlan& plan,
                                                               SavePlanner& planner) {
  return detail::write_files(plan, options_.single_file_per_rank, options_.thread_count,
                             [&](const detail::FileBucket& bucket) {
                               StringOutput out;
                               auto results = detail::write_bucket(bucket, planner, out);
                               storage_.put(checkpoint_id_, bucket.relative_path,
                                            std::move(out.bytes));
                               return results;
                             });
}

void MemoryWriter::finish(const Metadata& metadata,
                          const std::vector<std::vector<WriteResult>>& results) {
  storage_.put(checkpoint_id_, detail::paths::metadata_file(),
               detail::encode_metadata(metadata));
  for (const std::string& name :
       detail::unreferenced_data_files(storage_.list(checkpoint_id_), metadata, prefixes_)) {
    storage_.remove(checkpoint_id_, name);
  }
}

std::optional<StorageMeta> MemoryWriter::storage_meta() {
  StorageMeta meta;
  meta.checkpoint_id = checkpoint_id_;
  return meta;
}

MemoryReader::MemoryReader(MemoryStorage& storage, std::string checkpoint_id)
    : storage_(storage), checkpoint_id_(std::move(checkpoint_id)) {}

void MemoryReader::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) checkpoint_id_ = *checkpoint_id;
  metadata_ = nullptr;
}

Metadata MemoryReader::read_metadata() {
  auto bytes = storage_.get(checkpoint_id_, detail::paths::metadata_file());
  TORCH_CHECK(bytes.has_value(), "no checkpoint at '", checkpoint_id_, "' in memory storage: '",
              detail::paths::metadata_file(), "' not found");
  return detail::decode_metadata((*bytes)->data(), (*bytes)->size(),
                                 "'" + checkpoint_id_ + "/.metadata'");
}

void MemoryReader::set_up_storage_reader(const Metadata& metadata, bool is_coordinator,
                                         int rank) {
  metadata_ = &metadata;
}

LoadPlan MemoryReader::prepare_local_plan(LoadPlan plan) { return plan; }

std::vector<LoadPlan> MemoryReader::prepare_global_plan(std::vector<LoadPlan> plans) {
  return plans;
}

std::future<void> MemoryReader::read_data(const LoadPlan& plan, LoadPlanner& planner) {
  return detail::read_data(
      plan, planner, metadata_,
      [this](const std::string& relative) -> std::shared_ptr<const detail::InputFile> {
        auto bytes = storage_.get(checkpoint_id_, relative);
        TORCH_CHECK(bytes.has_value(), "data file '", relative, "' of checkpoint '",
                    checkpoint_id_, "' is missing");
        return std::make_shared<StringInputFile>(relative, *bytes);
      });
}

}  // namespace dcp
