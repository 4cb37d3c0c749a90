// libFuzzer target: the safetensors header parser (format/safetensors) on arbitrary bytes taken
// as a whole .safetensors file (8-byte length, JSON header, data). Every input must either
// parse or be refused with c10::Error; anything else is a finding. A parsed header must lie
// inside the file, and must survive encode_safetensors_header and a second parse with the
// same tensors (names, dtypes, shapes, lengths). Seeds: tests/fuzz/corpus/safetensors (files
// written by the safetensors package and by dcp's HuggingFaceStorageWriter).
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | data[k];
  if (n > size - 8) return 0;  // the reader refuses this before parsing
  const std::string json(reinterpret_cast<const char*>(data) + 8, n);
  dcp::detail::SafetensorsHeader header;
  try {
    header = dcp::detail::parse_safetensors_header(json, size, "'fuzz.safetensors'");
  } catch (const c10::Error&) {
    return 0;  // refused
  }
  for (const auto& t : header.tensors) {
    if (t.offset < 8 + n || t.offset + t.length > size) std::abort();
  }
  std::string again;
  try {
    again = dcp::detail::encode_safetensors_header(header.tensors, header.metadata);
  } catch (const c10::Error&) {
    return 0;  // a dtype safetensors cannot name again (none today)
  }
  uint64_t total = 0;
  for (const auto& t : header.tensors) total += t.length;
  const dcp::detail::SafetensorsHeader round_trip = dcp::detail::parse_safetensors_header(
      again.substr(8), again.size() + total, "'re-encoded header'");
  if (round_trip.tensors.size() != header.tensors.size()) std::abort();
  for (const auto& t : header.tensors) {
    bool found = false;
    for (const auto& u : round_trip.tensors) {
      found = found || (u.name == t.name && u.dtype == t.dtype && u.shape == t.shape &&
                        u.length == t.length);
    }
    if (!found) std::abort();
  }
  if (round_trip.metadata != header.metadata) std::abort();
  return 0;
}
