// On-disk names (see paths.h).
#include "storage/paths.h"

namespace dcp::detail::paths {

namespace {
constexpr const char kSuffix[] = ".distcp";
}

std::string metadata_file() { return ".metadata"; }
std::string metadata_temp_file() { return ".metadata.tmp"; }
std::string rank_prefix(int rank) { return "__" + std::to_string(rank) + "_"; }
std::string data_file(const std::string& prefix, int index) {
  return prefix + std::to_string(index) + kSuffix;
}
std::string probe_file(const std::string& save_id) { return ".dcp_probe_" + save_id; }
bool is_data_file(const std::string& name) {
  const std::string suffix = kSuffix;
  return name.size() > suffix.size() + 2 && name.compare(0, 2, "__") == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace dcp::detail::paths
