// LoadOptions::key_mapping and LoadOptions::strict (src/protocol/key_mapping.h).
#include "protocol/key_mapping.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "storage_data.h"
#include "util/names.h"

namespace dcp::detail {

namespace {

// A dotted key as a path of string items (the planner data of a renamed key).
ObjectPath split_key(const std::string& key) {
  ObjectPath path;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    path.emplace_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return path;
    start = dot + 1;
  }
}

}  // namespace

void apply_key_mapping(Metadata& metadata, const KeyMapping& mapping) {
  if (mapping.empty()) return;
  std::vector<size_t> prefix_uses(mapping.prefixes.size(), 0);
  std::set<std::string> keys_used;
  std::map<std::string, std::string> renamed;  // saved -> new, for every saved key
  std::map<std::string, std::string> owner;    // new -> saved, to find collisions
  for (const auto& entry : metadata.state_dict_metadata) {
    const std::string& saved = entry.first;
    std::string name = saved;
    if (auto it = mapping.keys.find(saved); it != mapping.keys.end()) {
      name = it->second;
      keys_used.insert(saved);
    } else {
      size_t best = mapping.prefixes.size();
      for (size_t i = 0; i < mapping.prefixes.size(); ++i) {
        const std::string& from = mapping.prefixes[i].first;
        if (saved.compare(0, from.size(), from) == 0 &&
            (best == mapping.prefixes.size() || from.size() > mapping.prefixes[best].first.size())) {
          best = i;
        }
      }
      if (best != mapping.prefixes.size()) {
        ++prefix_uses[best];
        name = mapping.prefixes[best].second + saved.substr(mapping.prefixes[best].first.size());
      } else if (mapping.function) {
        name = mapping.function(saved);
      }
    }
    TORCH_CHECK_VALUE(!name.empty(), "key mapping: checkpoint key '", saved,
                      "' was renamed to the empty string");
    auto [pos, inserted] = owner.emplace(name, saved);
    TORCH_CHECK_VALUE(inserted, "key mapping: checkpoint keys '", pos->second, "' and '", saved,
                      "' would both load into '", name, "'");
    renamed.emplace(saved, std::move(name));
  }
  for (size_t i = 0; i < mapping.prefixes.size(); ++i) {
    TORCH_CHECK_VALUE(prefix_uses[i] > 0, "key mapping: the prefix rule '",
                      mapping.prefixes[i].first, "' -> '", mapping.prefixes[i].second,
                      "' matches no key of the checkpoint (", metadata.state_dict_metadata.size(),
                      " keys)");
  }
  for (const auto& entry : mapping.keys) {
    TORCH_CHECK_VALUE(keys_used.count(entry.first), "key mapping: the checkpoint has no key '",
                      entry.first, "' (mapped to '", entry.second, "')");
  }

  decltype(metadata.state_dict_metadata) sdm;
  for (auto& [saved, md] : metadata.state_dict_metadata) sdm.emplace(renamed.at(saved), std::move(md));
  metadata.state_dict_metadata = std::move(sdm);
  // New names sort differently: the entries are renamed, then sorted again.
  auto storage = std::move(metadata.storage_data).release();
  for (auto& [index, info] : storage) {
    if (auto it = renamed.find(index.fqn); it != renamed.end()) index.fqn = it->second;
  }
  metadata.storage_data = detail::make_storage_data(std::move(storage));
  if (metadata.planner_data) {
    std::map<std::string, ObjectPath> planner_data;
    for (auto& [saved, path] : *metadata.planner_data) {
      auto it = renamed.find(saved);
      if (it == renamed.end() || it->second == saved) {
        planner_data.emplace(saved, std::move(path));
      } else {
        planner_data.emplace(it->second, split_key(it->second));
      }
    }
    metadata.planner_data = std::move(planner_data);
  }
}

LoadResult compare_keys(const StateDict& state, const Metadata& metadata) {
  const FlatStateDict flat = flatten_state_dict(state);
  LoadResult result;
  std::set<std::string> requested;
  for (const auto& item : flat.items) {
    requested.insert(item.first);
    if (!metadata.state_dict_metadata.count(item.first)) result.missing_keys.push_back(item.first);
  }
  for (const auto& entry : metadata.state_dict_metadata) {
    if (!requested.count(entry.first)) result.unexpected_keys.push_back(entry.first);
  }
  std::sort(result.missing_keys.begin(), result.missing_keys.end());
  std::sort(result.unexpected_keys.begin(), result.unexpected_keys.end());
  return result;
}

void handle_key_report(const LoadResult& result, StrictHandling strict, int rank) {
  if (strict == StrictHandling::kRaiseAll) {
    TORCH_CHECK_VALUE(result.missing_keys.empty() && result.unexpected_keys.empty(),
                      "strict load (StrictHandling::kRaiseAll): ", result.missing_keys.size(),
                      " missing key(s) [", quoted_names(result.missing_keys), "] and ",
                      result.unexpected_keys.size(), " unexpected key(s) [",
                      quoted_names(result.unexpected_keys), "]");
  } else if (strict == StrictHandling::kWarnAll) {
    if (!result.missing_keys.empty()) {
      std::cerr << "dcp: warning: rank " << rank << ": load: " << result.missing_keys.size()
                << " missing key(s) left as they were: " << quoted_names(result.missing_keys) << "\n";
    }
    if (!result.unexpected_keys.empty()) {
      std::cerr << "dcp: warning: rank " << rank << ": load: " << result.unexpected_keys.size()
                << " unexpected key(s) in the checkpoint not loaded: "
                << quoted_names(result.unexpected_keys) << "\n";
    }
  }
}

}  // namespace dcp::detail
