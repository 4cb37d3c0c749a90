// `dcp inspect` (see commands.h): reads only '.metadata' (and the data files' sizes).
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <fnmatch.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "dcp/filesystem.h"
#include "dcp/metadata.h"

namespace dcp::cli {
namespace {

using Json = nlohmann::ordered_json;

struct KeyInfo {
  std::string key;
  bool tensor = false;
  std::string dtype;
  std::vector<int64_t> shape;
  size_t chunks = 0;
  int64_t bytes = 0;         // a tensor's elements x element size; a value's stored record
  int64_t stored_bytes = 0;  // its records in the data files
  std::set<std::string> files;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string human(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// The rank a data file name belongs to ("__3_0.distcp", "__3_1a2b3c4d_0.distcp"), or -1.
int rank_of(const std::string& file) {
  if (file.rfind("__", 0) != 0) return -1;
  size_t end = 2;
  while (end < file.size() && std::isdigit(static_cast<unsigned char>(file[end]))) ++end;
  // At most 9 digits: names come from a possibly hostile .metadata, and std::stoi throws
  // std::out_of_range past INT_MAX.
  if (end == 2 || end > 2 + 9 || end >= file.size() || file[end] != '_') return -1;
  return std::stoi(file.substr(2, end - 2));
}

}  // namespace

bool key_matches(const std::string& glob, const std::string& key) {
  return ::fnmatch(glob.c_str(), key.c_str(), 0) == 0;
}

int inspect(const std::string& checkpoint, bool json, const std::optional<std::string>& keys) {
  const Metadata md = FileSystemReader(checkpoint).read_metadata();
  std::map<std::string, KeyInfo> infos;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (keys && !key_matches(*keys, fqn)) continue;
    KeyInfo& info = infos[fqn];
    info.key = fqn;
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      info.tensor = true;
      info.dtype = dtype_name(t->properties.dtype);
      info.shape = c10::IntArrayRef(t->size).vec();
      info.chunks = t->chunks.size();
      int64_t numel = 1;
      for (int64_t d : t->size) numel *= d;
      info.bytes = numel * static_cast<int64_t>(c10::elementSize(t->properties.dtype));
    } else {
      info.chunks = 1;
    }
  }
  TORCH_CHECK(!keys || !infos.empty(), "no key of '", checkpoint, "' matches '", *keys, "'");
  struct FileInfo {
    int rank = -1;
    int64_t size = 0;
    int64_t items = 0;
  };
  std::map<std::string, FileInfo> files;
  for (const auto& [index, storage] : md.storage_data) {
    FileInfo& f = files[storage.relative_path];
    ++f.items;
    auto it = infos.find(index.fqn);
    if (it == infos.end()) continue;
    it->second.stored_bytes += storage.length;
    if (!it->second.tensor) it->second.bytes += storage.length;
    it->second.files.insert(storage.relative_path);
  }
  int64_t file_bytes = 0;
  for (auto& [name, f] : files) {
    f.rank = rank_of(name);
    std::error_code ec;
    const auto size = std::filesystem::file_size(std::filesystem::path(checkpoint) / name, ec);
    f.size = ec ? -1 : static_cast<int64_t>(size);
    if (!ec) file_bytes += f.size;
  }
  int64_t tensors = 0, tensor_bytes = 0, stored = 0;
  for (const auto& [k, info] : infos) {
    tensors += info.tensor;
    if (info.tensor) tensor_bytes += info.bytes;
    stored += info.stored_bytes;
  }
  std::map<int, std::pair<int64_t, int64_t>> per_rank;  // rank -> files, bytes
  for (const auto& [name, f] : files) {
    per_rank[f.rank].first += 1;
    per_rank[f.rank].second += std::max<int64_t>(f.size, 0);
  }

  if (json) {
    Json out;
    out["checkpoint"] = checkpoint;
    out["version"] = md.version ? Json(*md.version) : Json(nullptr);
    Json meta = nullptr;
    if (md.storage_meta) {
      auto opt = [](const std::optional<std::string>& s) { return s ? Json(*s) : Json(nullptr); };
      meta = {{"checkpoint_id", opt(md.storage_meta->checkpoint_id)},
              {"save_id", opt(md.storage_meta->save_id)},
              {"load_id", opt(md.storage_meta->load_id)},
              {"modules", md.storage_meta->modules}};
    }
    out["storage_meta"] = meta;
    Json list = Json::array();
    for (const auto& [k, info] : infos) {
      Json j;
      j["key"] = info.key;
      j["kind"] = info.tensor ? "tensor" : "value";
      if (info.tensor) {
        j["dtype"] = info.dtype;
        j["shape"] = info.shape;
      }
      j["chunks"] = info.chunks;
      j["bytes"] = info.bytes;
      j["stored_bytes"] = info.stored_bytes;
      j["files"] = info.files;
      list.push_back(std::move(j));
    }
    out["keys"] = std::move(list);
    out["totals"] = {{"keys", infos.size()},
                     {"tensors", tensors},
                     {"values", infos.size() - tensors},
                     {"tensor_bytes", tensor_bytes},
                     {"stored_bytes", stored},
                     {"files", files.size()},
                     {"file_bytes", file_bytes}};
    Json ranks = Json::array();
    for (const auto& [rank, fb] : per_rank) {
      ranks.push_back({{"rank", rank}, {"files", fb.first}, {"bytes", fb.second}});
    }
    out["files_per_rank"] = std::move(ranks);
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  size_t key_width = 3;
  for (const auto& [k, info] : infos) key_width = std::max(key_width, k.size());
  std::printf("%-*s  %-6s  %-9s  %-18s  %6s  %10s  %s\n", static_cast<int>(key_width), "key",
              "kind", "dtype", "shape", "chunks", "bytes", "files");
  for (const auto& [k, info] : infos) {
    std::string file_list;
    for (const auto& f : info.files) file_list += (file_list.empty() ? "" : ",") + f;
    std::printf("%-*s  %-6s  %-9s  %-18s  %6zu  %10s  %s\n", static_cast<int>(key_width), k.c_str(),
                info.tensor ? "tensor" : "value", info.dtype.c_str(),
                info.tensor ? shape_text(info.shape).c_str() : "", info.chunks,
                human(info.bytes).c_str(), file_list.c_str());
  }
  std::printf(
      "\n%zu keys (%lld tensors, %lld values), %s of tensors, %s stored in %zu files "
      "(%s on disk)\n",
      infos.size(), static_cast<long long>(tensors), static_cast<long long>(infos.size() - tensors),
      human(tensor_bytes).c_str(), human(stored).c_str(), files.size(), human(file_bytes).c_str());
  std::printf("version %s", md.version ? md.version->c_str() : "(none)");
  if (md.storage_meta) {
    std::printf("; save_id %s; checkpoint_id %s",
                md.storage_meta->save_id.value_or("(none)").c_str(),
                md.storage_meta->checkpoint_id.value_or("(none)").c_str());
  }
  std::printf("\nfiles per rank:");
  for (const auto& [rank, fb] : per_rank) {
    const std::string who = rank < 0 ? "other" : std::to_string(rank);
    std::printf(" %s: %lld (%s)", who.c_str(), static_cast<long long>(fb.first),
                human(fb.second).c_str());
  }
  std::printf("\n");
  return 0;
}

}  // namespace dcp::cli
