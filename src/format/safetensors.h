// The safetensors file format (Hugging Face; https://github.com/huggingface/safetensors): an
// 8-byte little-endian header length N, N bytes of JSON ({"name": {"dtype": "F32", "shape":
// [...], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}), then the raw,
// row-major, little-endian tensor data, offsets relative to its start. The header is parsed with
// nlohmann/json and validated like '.metadata': size bounded, every dtype known, every shape's
// byte count equal to its range, every range inside the file, no two ranges overlapping.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dcp::detail {

/// The largest header accepted (the safetensors library's own limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute, in the file
  uint64_t length = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;
};

/// Parses the JSON header of a file of `file_size` bytes whose header is `json` (so the data
/// starts at 8 + json.size()). Throws c10::Error naming `where` and the tensor on anything
/// malformed or out of bounds.
SafetensorsHeader parse_safetensors_header(const std::string& json, uint64_t file_size,
                                           const std::string& where);

/// The first bytes of a safetensors file holding `tensors` in order (their `offset` fields are
/// ignored: the data follows the header back to back, in that order): the 8-byte length and the
/// JSON header, padded with spaces to a multiple of 8 bytes as the safetensors library does.
std::string encode_safetensors_header(const std::vector<SafetensorsTensor>& tensors,
                                      const std::map<std::string, std::string>& metadata);

/// "F32" <-> Float, "BF16" <-> BFloat16, ...; throws for a name or dtype safetensors lacks.
c10::ScalarType safetensors_dtype(const std::string& name, const std::string& where);
std::string safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace dcp::detail
