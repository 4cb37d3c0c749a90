// The safetensors header (see safetensors.h).
#include "format/safetensors.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "util/checked.h"

namespace dcp::detail {
namespace {

const std::vector<std::pair<const char*, c10::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<const char*, c10::ScalarType>> table = {
      {"F64", c10::ScalarType::Double},   {"F32", c10::ScalarType::Float},
      {"F16", c10::ScalarType::Half},     {"BF16", c10::ScalarType::BFloat16},
      {"I64", c10::ScalarType::Long},     {"I32", c10::ScalarType::Int},
      {"I16", c10::ScalarType::Short},    {"I8", c10::ScalarType::Char},
      {"U8", c10::ScalarType::Byte},      {"BOOL", c10::ScalarType::Bool},
      {"U16", c10::ScalarType::UInt16},   {"U32", c10::ScalarType::UInt32},
      {"U64", c10::ScalarType::UInt64},   {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
      {"F8_E5M2", c10::ScalarType::Float8_e5m2}, {"C64", c10::ScalarType::ComplexFloat}};
  return table;
}

}  // namespace

c10::ScalarType safetensors_dtype(const std::string& name, const std::string& where) {
  for (const auto& [n, t] : dtype_table()) {
    if (name == n) return t;
  }
  TORCH_CHECK(false, where, ": unknown safetensors dtype '", name, "'");
}

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& [n, t] : dtype_table()) {
    if (dtype == t) return n;
  }
  TORCH_CHECK(false, "safetensors has no dtype for ", dtype);
}

std::string encode_safetensors_header(const std::vector<SafetensorsTensor>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    doc[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + t.length}}};
    offset += t.length;
  }
  std::string json = doc.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int k = 0; k < 8; ++k, n >>= 8) out[k] = static_cast<char>(n & 0xff);
  return out + json;
}

SafetensorsHeader parse_safetensors_header(const std::string& json, uint64_t file_size,
                                           const std::string& where) {
  TORCH_CHECK(json.size() <= kMaxSafetensorsHeaderBytes, where, ": a safetensors header of ",
              json.size(), " bytes (more than ", kMaxSafetensorsHeaderBytes, ")");
  const uint64_t data_start = 8 + json.size();
  TORCH_CHECK(data_start <= file_size, where, ": the safetensors header (", json.size(),
              " bytes) runs past the end of the file (", file_size, " bytes)");
  const uint64_t data_bytes = file_size - data_start;
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(!doc.is_discarded() && doc.is_object(), where,
              ": the safetensors header is not a JSON object");
  SafetensorsHeader out;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      TORCH_CHECK(v.is_object(), where, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        TORCH_CHECK(m.value().is_string(), where, ": __metadata__['", m.key(),
                    "'] is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = where + ": tensor '" + name + "'";
    TORCH_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() &&
                    v.contains("shape") && v["shape"].is_array() && v.contains("data_offsets") &&
                    v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                what, ": needs a string dtype, an array shape and two data_offsets");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = safetensors_dtype(v["dtype"].get<std::string>(), what);
    for (const auto& d : v["shape"]) {
      TORCH_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= uint64_t{INT64_MAX}, what,
                  ": shape entries must be non-negative integers");
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    const auto& offsets = v["data_offsets"];
    TORCH_CHECK(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), what,
                ": data_offsets must be non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    TORCH_CHECK(begin <= end && end <= data_bytes, what, ": data_offsets [", begin, ", ", end,
                ") leave the data section of ", data_bytes, " bytes");
    const std::optional<int64_t> numel = checked_volume(t.shape);
    const std::optional<int64_t> bytes =
        numel ? checked_mul(*numel, static_cast<int64_t>(c10::elementSize(t.dtype))) : std::nullopt;
    TORCH_CHECK(bytes && static_cast<uint64_t>(*bytes) == end - begin, what, ": shape ",
                c10::IntArrayRef(t.shape), " of ", safetensors_dtype_name(t.dtype), " needs ",
                bytes ? std::to_string(*bytes) : std::string("more than 2^63"),
                " bytes, data_offsets give ", end - begin);
    t.offset = data_start + begin;
    t.length = end - begin;
    out.tensors.push_back(std::move(t));
  }
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : out.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* a = by_offset[i - 1];
    const auto* b = by_offset[i];
    TORCH_CHECK(a->offset + a->length <= b->offset || b->length == 0 || a->length == 0, where,
                ": tensors '", a->name, "' and '", b->name, "' share bytes");
  }
  return out;
}

}  // namespace dcp::detail
