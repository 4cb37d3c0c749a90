// On-disk names (see paths.h).
#include "storage/paths.h"

#include <c10/util/Exception.h>

#include <cctype>

namespace dcp::detail::paths {

namespace {
constexpr const char kSuffix[] = ".distcp";
}

std::string metadata_file() { return ".metadata"; }
std::string metadata_temp_file() { return ".metadata.tmp"; }
std::string rank_prefix(int rank, const std::string& save_token) {
  return "__" + std::to_string(rank) + "_" + (save_token.empty() ? "" : save_token + "_");
}
std::string save_token(const std::string& save_id) {
  std::string token;
  for (char c : save_id) {
    if (token.size() == 8) break;
    if (std::isxdigit(static_cast<unsigned char>(c))) token.push_back(c);
  }
  return token;
}
std::string metadata_checksum_file() { return ".metadata.checksum"; }
std::string metadata_checksum_temp_file() { return ".metadata.checksum.tmp"; }
std::string lock_file() { return ".dcp_lock"; }
std::string rank_metadata_file(int rank) { return "__" + std::to_string(rank) + ".metadata"; }

std::string rank_metadata_temp_file(int rank) { return rank_metadata_file(rank) + ".tmp"; }

std::optional<int> parse_rank_metadata_file(const std::string& name) {
  constexpr size_t kMaxDigits = 9;  // below INT_MAX
  const std::string suffix = ".metadata";
  if (name.size() <= 2 + suffix.size() || name.compare(0, 2, "__") != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(2, name.size() - 2 - suffix.size());
  if (digits.size() > kMaxDigits || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return std::stoi(digits);
}

namespace {
std::string five_digits(int n) {
  std::string s = std::to_string(n);
  return s.size() >= 5 ? s : std::string(5 - s.size(), '0') + s;
}
}  // namespace

std::string hf_model_file(int index, int count, std::optional<int> shard) {
  const std::string model = "model-" + five_digits(index) + "-of-" + five_digits(count);
  return (shard ? "shard-" + five_digits(*shard) + "-" + model : model) + ".safetensors";
}

std::string hf_index_file() { return "model.safetensors.index.json"; }

std::string hf_sharded_directory() { return "sharded"; }

std::string hf_temp_file(const std::string& name) { return name + ".tmp"; }

std::string step_directory(int64_t step) { return "step_" + std::to_string(step); }

std::optional<int64_t> parse_step_directory(const std::string& name) {
  constexpr const char* kPrefix = "step_";
  constexpr size_t kPrefixSize = 5;
  constexpr size_t kMaxDigits = 18;  // below INT64_MAX
  if (name.compare(0, kPrefixSize, kPrefix) != 0) return std::nullopt;
  const std::string digits = name.substr(kPrefixSize);
  if (digits.empty() || digits.size() > kMaxDigits) return std::nullopt;
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return std::stoll(digits);
}

std::string data_file(const std::string& prefix, int index) {
  return prefix + std::to_string(index) + kSuffix;
}
std::string probe_file(const std::string& save_id) { return ".dcp_probe_" + save_id; }
bool is_data_file(const std::string& name) {
  const std::string suffix = kSuffix;
  return name.size() > suffix.size() + 2 && name.compare(0, 2, "__") == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string printable(const std::string& name) {
  std::string shown;
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f) {
      shown.push_back(static_cast<char>(c));
    } else {
      static const char kHex[] = "0123456789abcdef";
      shown += "\\x";
      shown.push_back(kHex[c >> 4]);
      shown.push_back(kHex[c & 15]);
    }
  }
  return shown;
}

void check_relative_name(const std::string& relative) {
  const std::string shown = printable(relative);
  const auto refuse = [&](const char* why) {
    TORCH_CHECK(false, "data file name '", shown, "' in the checkpoint metadata ", why,
                ": refusing to open it");
  };
  if (relative.empty()) refuse("is empty");
  if (relative.find('\0') != std::string::npos) refuse("holds a NUL byte");
  if (relative.front() == '/') refuse("is an absolute path");
  size_t begin = 0;
  while (begin <= relative.size()) {
    size_t end = relative.find('/', begin);
    if (end == std::string::npos) end = relative.size();
    const std::string part = relative.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") {
      refuse("has an empty, '.' or '..' component (it could leave the checkpoint directory)");
    }
    begin = end + 1;
  }
}

}  // namespace dcp::detail::paths
