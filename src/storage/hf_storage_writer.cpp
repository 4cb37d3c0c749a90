// HuggingFaceStorageWriter (dcp/hf_storage.h): a save as safetensors files, with Python's file
// names, header metadata and index (torch/distributed/checkpoint/hf_storage.py).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "dcp/hf_storage.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "storage/paths.h"
#include "util/error_context.h"
#include "util/parallel.h"

namespace dcp {
namespace {

// Python writes these into every file's __metadata__ (_hf_utils.py).
constexpr const char* kShardingInfoKey = "DCP_SHARDING_INFO";
constexpr const char* kVersionKey = "DCP_VERSION";
constexpr const char* kVersion = "1.0";

int64_t chunk_bytes(const WriteItem& item) {
  int64_t n = static_cast<int64_t>(c10::elementSize(item.tensor_data->properties.dtype));
  for (int64_t s : item.tensor_data->chunk.sizes) n *= s;
  return n;
}

// Writes `dir`/`name` through a temporary name and a rename: `fill` writes the contents.
void write_file_atomically(const std::string& dir, const std::string& name, bool sync,
                           const std::function<void(detail::File&)>& fill) {
  const std::string tmp = detail::join_path(dir, detail::paths::hf_temp_file(name));
  try {
    detail::File file = detail::File::open(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    fill(file);
    if (sync) file.sync();
    file.close();
    detail::rename_file(tmp, detail::join_path(dir, name));
  } catch (...) {
    detail::remove_file_quietly(tmp);
    throw;
  }
}

// model.safetensors.index.json: every tensor's file, and the tensors' total bytes.
void write_index(const std::string& dir, const nlohmann::ordered_json& weight_map, int64_t total,
                 bool sync) {
  const std::string bytes =
      nlohmann::ordered_json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}
          .dump(2);
  write_file_atomically(dir, detail::paths::hf_index_file(), sync,
                        [&](detail::File& f) { f.write_all(bytes.data(), bytes.size()); });
}

}  // namespace

HuggingFaceStorageWriter::HuggingFaceStorageWriter(std::string path,
                                                   HuggingFaceStorageWriterOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  for (const auto& [fqn, index] : options_.fqn_to_index_mapping) {
    TORCH_CHECK_VALUE(index >= 1, "fqn_to_index_mapping['", fqn, "'] is ", index,
                      "; file indices start at 1");
  }
  TORCH_CHECK_VALUE(options_.thread_count >= 1 && options_.thread_count_consolidation >= 1,
                    "HuggingFaceStorageWriter: thread_count and thread_count_consolidation must "
                    "be >= 1");
}

void HuggingFaceStorageWriter::reset(const std::optional<std::string>& checkpoint_id) {
  if (checkpoint_id) path_ = *checkpoint_id;
}

void HuggingFaceStorageWriter::set_up_storage_writer(bool, int rank) { rank_ = rank; }

SavePlan HuggingFaceStorageWriter::prepare_local_plan(SavePlan plan) {
  TORCH_CHECK(!path_.empty(), "HuggingFaceStorageWriter: no path (pass a checkpoint_id)");
  detail::create_directories(data_directory());
  std::set<std::string> names;
  for (const WriteItem& item : plan.items) {
    TORCH_CHECK_VALUE(item.type != WriteItemType::BYTE_IO, "'", item.index.fqn,
                      "' is not a tensor: a Hugging Face model (safetensors) holds tensors only");
    TORCH_CHECK_VALUE(options_.fqn_to_index_mapping.empty() ||
                          options_.fqn_to_index_mapping.count(item.index.fqn),
                      "'", item.index.fqn, "' has no file in fqn_to_index_mapping");
    TORCH_CHECK_VALUE(names.insert(item.index.fqn).second, "'", item.index.fqn,
                      "' has several chunks on rank ", rank_,
                      ": a safetensors file holds one tensor per name");
    if (!options_.save_distributed) {
      TORCH_CHECK_VALUE(item.tensor_data->chunk.sizes == item.tensor_data->size, "'",
                        item.index.fqn, "' is a shard of a larger tensor: save whole tensors, ",
                        "or set save_distributed");
    }
  }
  return plan;
}

std::vector<SavePlan> HuggingFaceStorageWriter::prepare_global_plan(std::vector<SavePlan> plans) {
  int writers = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    plans[i].storage_data = std::to_string(i + 1);  // the shard index of save_distributed
    writers += !plans[i].items.empty();
  }
  TORCH_CHECK_VALUE(options_.save_distributed || writers <= 1, writers, " ranks have tensors to ",
                    "write, and without save_distributed they would write the same files: save ",
                    "from one rank (no_dist) or set save_distributed");
  return plans;
}

std::future<std::vector<WriteResult>> HuggingFaceStorageWriter::write_data(const SavePlan& plan,
                                                                           SavePlanner& planner) {
  std::promise<std::vector<WriteResult>> promise;
  try {
    int count = 1;
    for (const auto& [fqn, index] : options_.fqn_to_index_mapping) count = std::max(count, index);
    std::map<int, std::vector<const WriteItem*>> buckets;
    for (const WriteItem& item : plan.items) {
      const auto it = options_.fqn_to_index_mapping.find(item.index.fqn);
      buckets[it == options_.fqn_to_index_mapping.end() ? 1 : it->second].push_back(&item);
    }
    const std::optional<int> shard =
        options_.save_distributed ? std::optional<int>(std::stoi(plan.storage_data)) : std::nullopt;
    std::vector<std::vector<WriteResult>> per_file(buckets.size());
    std::vector<std::pair<int, std::vector<const WriteItem*>>> files(buckets.begin(), buckets.end());
    detail::run_parallel(files.size(), options_.thread_count, [&](size_t f) {
      const std::string name = detail::paths::hf_model_file(files[f].first, count, shard);
      const auto& items = files[f].second;
      std::vector<detail::SafetensorsTensor> tensors;
      nlohmann::ordered_json sharding = nlohmann::ordered_json::object();
      for (const WriteItem* item : items) {
        detail::SafetensorsTensor t;
        t.name = item->index.fqn;
        t.dtype = item->tensor_data->properties.dtype;
        t.shape = c10::IntArrayRef(item->tensor_data->chunk.sizes).vec();
        t.length = static_cast<uint64_t>(chunk_bytes(*item));
        tensors.push_back(std::move(t));
        sharding[item->index.fqn] = {{"saved_offsets", item->tensor_data->chunk.offsets}};
      }
      const std::string header = detail::encode_safetensors_header(
          tensors, {{kShardingInfoKey, sharding.dump()}, {kVersionKey, kVersion}, {"format", "pt"}});
      const std::string path = detail::join_path(data_directory(), name);
      detail::with_context(
          [&] {
            detail::File file = detail::File::open(path, O_WRONLY | O_CREAT | O_TRUNC);
            file.write_all(header.data(), header.size());
            uint64_t offset = header.size();
            for (size_t i = 0; i < items.size(); ++i) {
              WritePayload payload = planner.resolve_data(*items[i]);
              const auto* tensor = std::get_if<at::Tensor>(&payload);
              TORCH_CHECK(tensor != nullptr, "'", items[i]->index.fqn, "' resolved to a non-tensor");
              const at::Tensor data = tensor->detach().cpu().contiguous();
              TORCH_CHECK(static_cast<uint64_t>(data.nbytes()) == tensors[i].length, "'",
                          items[i]->index.fqn, "' resolved to ", data.nbytes(), " bytes, its chunk has ",
                          tensors[i].length);
              file.write_all(data.data_ptr(), data.nbytes());
              WriteResult r;
              r.index = items[i]->index;
              r.size_in_bytes = static_cast<int64_t>(tensors[i].length);
              r.storage_data = StorageInfo{name, static_cast<int64_t>(offset),
                                           static_cast<int64_t>(tensors[i].length), {}};
              per_file[f].push_back(std::move(r));
              offset += tensors[i].length;
            }
            if (options_.sync_files) file.sync();
            file.close();
          },
          [&] { return c10::str("writing safetensors file '", path, "'"); });
    });
    std::vector<WriteResult> results;
    for (auto& r : per_file) {
      for (auto& w : r) results.push_back(std::move(w));
    }
    promise.set_value(std::move(results));
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  return promise.get_future();
}

std::string HuggingFaceStorageWriter::data_directory() const {
  return options_.enable_consolidation
             ? detail::join_path(path_, detail::paths::hf_sharded_directory())
             : path_;
}

void HuggingFaceStorageWriter::finish(const Metadata& metadata,
                                      const std::vector<std::vector<WriteResult>>& results) {
  if (options_.save_distributed) {  // as Python: chunked files have no index
    if (options_.enable_consolidation) consolidate(metadata);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (const auto& rank_results : results) {
    for (const auto& r : rank_results) {
      weight_map[r.index.fqn] = r.storage_data.relative_path;
      total += r.storage_data.length;
    }
  }
  write_index(data_directory(), weight_map, total, options_.sync_files);
  if (options_.sync_files) detail::sync_directory(data_directory());
}

// Python's consolidate_safetensors_files, from the save's own Metadata rather than from a scan
// of the folder (a stale file there cannot leak in): each output file gets its tensors whole,
// in the checkpoint's key order; each tensor is assembled in memory from its saved chunks
// (ranged reads of the chunked files) and written after the header.
void HuggingFaceStorageWriter::consolidate(const Metadata& metadata) const {
  int count = 1;
  for (const auto& [fqn, index] : options_.fqn_to_index_mapping) count = std::max(count, index);
  std::map<int, std::vector<std::pair<std::string, const TensorStorageMetadata*>>> files;
  for (const auto& [fqn, entry] : metadata.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    TORCH_CHECK_VALUE(t != nullptr, "'", fqn, "' is not a tensor");
    const auto it = options_.fqn_to_index_mapping.find(fqn);
    files[it == options_.fqn_to_index_mapping.end() ? 1 : it->second].emplace_back(fqn, t);
  }
  const std::string sharded = data_directory();
  std::vector<std::pair<int, std::vector<std::pair<std::string, const TensorStorageMetadata*>>>>
      outputs(files.begin(), files.end());
  std::vector<std::vector<detail::SafetensorsTensor>> headers(outputs.size());
  detail::run_parallel(outputs.size(), options_.thread_count_consolidation, [&](size_t f) {
    const std::string name = detail::paths::hf_model_file(outputs[f].first, count);
    auto& tensors = headers[f];
    for (const auto& [fqn, t] : outputs[f].second) {
      detail::SafetensorsTensor out;
      out.name = fqn;
      out.dtype = t->properties.dtype;
      out.shape = c10::IntArrayRef(t->size).vec();
      out.length = static_cast<uint64_t>(c10::elementSize(out.dtype));
      for (int64_t s : t->size) out.length *= static_cast<uint64_t>(s);
      tensors.push_back(std::move(out));
    }
    const std::string header = detail::encode_safetensors_header(tensors, {});
    detail::with_context(
        [&] {
          write_file_atomically(path_, name, options_.sync_files, [&](detail::File& file) {
            file.write_all(header.data(), header.size());
            for (const auto& [fqn, t] : outputs[f].second) {
              const at::TensorOptions dtype = at::TensorOptions().dtype(t->properties.dtype);
              at::Tensor whole = at::zeros(t->size, dtype);  // what no chunk covers reads 0
              for (const ChunkStorageMetadata& chunk : t->chunks) {
                const auto where = metadata.storage_data.find(MetadataIndex(fqn, chunk.offsets));
                TORCH_CHECK(where != metadata.storage_data.end(), "no file holds the chunk of '",
                            fqn, "' at offsets ", c10::IntArrayRef(chunk.offsets));
                at::Tensor part = at::empty(chunk.sizes, dtype);
                TORCH_CHECK(static_cast<int64_t>(part.nbytes()) == where->second.length, "the ",
                            "chunk of '", fqn, "' in '", where->second.relative_path, "' has ",
                            where->second.length, " bytes, its shape needs ", part.nbytes());
                detail::File::open(detail::join_path(sharded, where->second.relative_path),
                                   O_RDONLY)
                    .pread_all(part.data_ptr(), part.nbytes(),
                               static_cast<uint64_t>(where->second.offset));
                at::Tensor box = whole;
                for (size_t d = 0; d < chunk.offsets.size(); ++d) {
                  box = box.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
                }
                box.copy_(part);
              }
              file.write_all(whole.data_ptr(), whole.nbytes());
            }
          });
        },
        [&] { return c10::str("consolidating into '", detail::join_path(path_, name), "'"); });
  });
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t f = 0; f < outputs.size(); ++f) {
    const std::string name = detail::paths::hf_model_file(outputs[f].first, count);
    for (const auto& t : headers[f]) {
      weight_map[t.name] = name;
      total += static_cast<int64_t>(t.length);
    }
  }
  write_index(path_, weight_map, total, options_.sync_files);
  if (options_.sync_files) detail::sync_directory(path_);
}

}  // namespace dcp
