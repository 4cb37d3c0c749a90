// HuggingFaceStorageReader (dcp/hf_storage.h): safetensors files as a dcp checkpoint.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "dcp/hf_storage.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "storage/paths.h"
#include "storage/posix_input_file.h"
#include "storage/read_schedule.h"
#include "storage_data.h"
#include "util/checked.h"
#include "util/error_context.h"
#include "util/parallel.h"

namespace dcp {
namespace {

constexpr uint64_t kMaxIndexBytes = 64 << 20;

// The safetensors files of a model directory: those the index names, or every *.safetensors.
std::vector<std::string> model_files(const std::string& dir) {
  const std::string index = detail::join_path(dir, detail::paths::hf_index_file());
  std::set<std::string> files;
  if (detail::path_exists(index)) {
    const nlohmann::json doc =
        nlohmann::json::parse(detail::read_file(index, kMaxIndexBytes), nullptr, false);
    TORCH_CHECK(!doc.is_discarded() && doc.is_object() && doc.contains("weight_map") &&
                    doc["weight_map"].is_object(),
                "'", index, "' is not a safetensors index (a JSON object with a weight_map)");
    for (auto it = doc["weight_map"].begin(); it != doc["weight_map"].end(); ++it) {
      TORCH_CHECK(it.value().is_string(), "'", index, "': weight_map['", it.key(),
                  "'] is not a file name");
      const std::string name = it.value().get<std::string>();
      detail::paths::check_relative_name(name);
      files.insert(name);
    }
  } else {
    TORCH_CHECK(detail::is_directory(dir), "no Hugging Face model at '", dir,
                "': the directory does not exist");
    for (const std::string& name : detail::list_directory(dir)) {
      const std::string suffix = ".safetensors";
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        files.insert(name);
      }
    }
  }
  TORCH_CHECK(!files.empty(), "no Hugging Face model at '", dir, "': no .safetensors file and no ",
              detail::paths::hf_index_file());
  return {files.begin(), files.end()};
}

detail::SafetensorsHeader read_header(const detail::InputFile& file) {
  uint8_t size_bytes[8];
  TORCH_CHECK(file.size() >= 8, "'", file.name(), "' is too short for a safetensors file (",
              file.size(), " bytes)");
  file.read(0, size_bytes, 8);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | size_bytes[k];
  TORCH_CHECK(n <= detail::kMaxSafetensorsHeaderBytes && n <= file.size() - 8, "'", file.name(),
              "': a safetensors header of ", n, " bytes (the file has ", file.size(), ")");
  std::string json(n, '\0');
  file.read(8, json.data(), n);
  return detail::parse_safetensors_header(json, file.size(), "'" + file.name() + "'");
}

}  // namespace

HuggingFaceStorageReader::HuggingFaceStorageReader(std::string path,
                                                   HuggingFaceStorageReaderOptions options)
    : path_(std::move(path)), options_(options) {}

void HuggingFaceStorageReader::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) path_ = *checkpoint_id;
  metadata_ = nullptr;
}

namespace {

// Python's HuggingFaceStorageWriter(save_distributed=True) writes each rank's chunks to its own
// files and records, in the header's __metadata__["DCP_SHARDING_INFO"] (JSON), each tensor's
// {"saved_offsets": [...]}: a tensor is then the union of its chunks over the files, its size the
// largest extent, as Python's reader builds it.
std::map<std::string, std::vector<int64_t>> saved_offsets(const detail::SafetensorsHeader& header,
                                                          const std::string& file) {
  std::map<std::string, std::vector<int64_t>> out;
  auto it = header.metadata.find("DCP_SHARDING_INFO");
  if (it == header.metadata.end()) return out;
  const nlohmann::json info = nlohmann::json::parse(it->second, nullptr, false);
  TORCH_CHECK(!info.is_discarded() && info.is_object(), "'", file,
              "': DCP_SHARDING_INFO is not a JSON object");
  for (auto e = info.begin(); e != info.end(); ++e) {
    const auto& v = e.value();
    TORCH_CHECK(v.is_object() && v.contains("saved_offsets") && v["saved_offsets"].is_array(),
                "'", file, "': DCP_SHARDING_INFO['", e.key(), "'] has no saved_offsets list");
    std::vector<int64_t> offsets;
    for (const auto& o : v["saved_offsets"]) {
      TORCH_CHECK(o.is_number_unsigned() && o.get<uint64_t>() <= uint64_t{INT64_MAX} / 2, "'",
                  file, "': DCP_SHARDING_INFO['", e.key(), "'] has a bad offset");
      offsets.push_back(static_cast<int64_t>(o.get<uint64_t>()));
    }
    out.emplace(e.key(), std::move(offsets));
  }
  return out;
}

}  // namespace

Metadata HuggingFaceStorageReader::read_metadata() {
  TORCH_CHECK(!path_.empty(), "HuggingFaceStorageReader: no model path (pass a checkpoint_id)");
  Metadata md;
  std::map<MetadataIndex, std::string> file_of;  // chunk -> file, to name duplicates
  std::vector<std::pair<MetadataIndex, StorageInfo>> storage;  // sorted once, at the end
  for (const std::string& name : model_files(path_)) {
    const detail::PosixInputFile file(path_, name);
    const detail::SafetensorsHeader header = read_header(file);
    const auto offsets_of = saved_offsets(header, name);
    for (const auto& t : header.tensors) {
      std::vector<int64_t> offsets(t.shape.size(), 0);
      if (auto it = offsets_of.find(t.name); it != offsets_of.end()) offsets = it->second;
      TORCH_CHECK(offsets.size() == t.shape.size(), "'", name, "': tensor '", t.name, "' has ",
                  t.shape.size(), " dimensions but ", offsets.size(), " saved offsets");
      const MetadataIndex index(t.name, offsets);
      auto [where, inserted] = file_of.emplace(index, name);
      TORCH_CHECK(inserted, "tensor '", t.name, "' at ", c10::IntArrayRef(offsets),
                  " is in both '", where->second, "' and '", name, "'");
      auto [entry, fresh] = md.state_dict_metadata.emplace(t.name, TensorStorageMetadata{});
      auto& tensor = std::get<TensorStorageMetadata>(entry->second);
      if (fresh) {
        tensor.properties.dtype = t.dtype;
        tensor.size.assign(t.shape.size(), 0);
      }
      TORCH_CHECK(tensor.properties.dtype == t.dtype && tensor.size.size() == t.shape.size(),
                  "'", name, "': chunk of tensor '", t.name, "' has another dtype or rank than "
                  "its other chunks");
      for (size_t d = 0; d < t.shape.size(); ++d) {
        // A zero-volume chunk may claim any shape: its extent is checked, not assumed.
        const std::optional<int64_t> end = detail::checked_add(offsets[d], t.shape[d]);
        TORCH_CHECK(end.has_value(), "'", name, "': tensor '", t.name, "' at saved offset ",
                    offsets[d], " with size ", t.shape[d], " in dimension ", d,
                    " ends past 2^63");
        tensor.size[d] = std::max(tensor.size[d], *end);
      }
      tensor.chunks.push_back(ChunkStorageMetadata{Dims(offsets), Dims(t.shape)});
      storage.emplace_back(
          MetadataIndex(t.name, offsets, static_cast<int64_t>(tensor.chunks.size() - 1)),
          StorageInfo{name, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.length), {}});
    }
  }
  md.storage_data = detail::make_storage_data(std::move(storage));  // file_of: keys are unique
  return md;
}

void HuggingFaceStorageReader::set_up_storage_reader(const Metadata& metadata, bool, int) {
  metadata_ = &metadata;
}

LoadPlan HuggingFaceStorageReader::prepare_local_plan(LoadPlan plan) { return plan; }

std::vector<LoadPlan> HuggingFaceStorageReader::prepare_global_plan(std::vector<LoadPlan> plans) {
  return plans;
}

// Each read's box is a row-major range of its tensor's raw bytes: only the bytes between the
// box's first and last element are read, then copied into the destination.
std::future<void> HuggingFaceStorageReader::read_data(const LoadPlan& plan, LoadPlanner& planner) {
  std::promise<void> promise;
  try {
    TORCH_CHECK(metadata_ != nullptr, "read_data before set_up_storage_reader");
    const Metadata& md = *metadata_;
    std::mutex files_mu;
    std::map<std::string, std::shared_ptr<const detail::InputFile>> files;  // guarded by files_mu
    auto file = [&](const std::string& relative) {
      std::lock_guard<std::mutex> lock(files_mu);
      auto it = files.find(relative);
      if (it == files.end()) {
        it = files.emplace(relative, std::make_shared<detail::PosixInputFile>(path_, relative))
                 .first;
      }
      return it->second;
    };
    detail::run_parallel(plan.items.size(), options_.thread_count, [&](size_t i) {
      const ReadItem& item = plan.items[i];
      auto info_it = md.storage_data.find(item.storage_index);
      detail::with_context(
          [&] {
            TORCH_CHECK(item.type == LoadItemType::TENSOR,
                        "a Hugging Face model holds only tensors");
            TORCH_CHECK(info_it != md.storage_data.end(), "no storage entry for the chunk");
            const StorageInfo& info = info_it->second;
            const auto& tensor =
                std::get<TensorStorageMetadata>(md.state_dict_metadata.at(item.storage_index.fqn));
            const ChunkStorageMetadata* chunk = nullptr;  // the stored chunk (row-major)
            for (const auto& c : tensor.chunks) {
              if (item.storage_index.offset && c.offsets == *item.storage_index.offset) chunk = &c;
            }
            TORCH_CHECK(chunk != nullptr, "no stored chunk at the read's offsets");
            std::vector<int64_t> strides(chunk->sizes.size(), 1);
            for (size_t d = chunk->sizes.size(); d-- > 1;) {
              strides[d - 1] = strides[d] * chunk->sizes[d];
            }
            at::Tensor dest = planner.resolve_tensor(item);
            TORCH_CHECK(dest.sizes() == c10::IntArrayRef(item.lengths), "destination box ",
                        dest.sizes(), " does not match the read box ",
                        c10::IntArrayRef(item.lengths));
            const auto extent = detail::box_extent(item.storage_offsets, item.lengths, strides);
            if (extent) {
              const int64_t itemsize = static_cast<int64_t>(c10::elementSize(tensor.properties.dtype));
              const int64_t count = extent->second - extent->first + 1;
              const uint64_t begin = static_cast<uint64_t>(extent->first * itemsize);
              const uint64_t nbytes = static_cast<uint64_t>(count * itemsize);
              TORCH_CHECK(begin + nbytes <= static_cast<uint64_t>(info.length),
                          "the read box leaves the tensor's bytes");
              at::Tensor span =
                  at::empty({count}, at::TensorOptions().dtype(tensor.properties.dtype));
              file(info.relative_path)
                  ->read(static_cast<uint64_t>(info.offset) + begin, span.data_ptr(), nbytes);
              dest.copy_(span.as_strided(item.lengths, strides, 0));
            }
            planner.commit_tensor(item, dest);
          },
          [&] {
            return c10::str("reading '", item.storage_index.fqn, "' from Hugging Face model '",
                            path_, "'",
                            info_it == md.storage_data.end()
                                ? std::string()
                                : c10::str(" file '", info_it->second.relative_path, "'"));
          });
    });
    promise.set_value();
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  return promise.get_future();
}

}  // namespace dcp
