// libFuzzer target: the '.metadata' decoder (restricted pickle reader + Metadata interpretation)
// on arbitrary bytes. Every input must either decode or be refused with c10::Error; anything
// else (a crash, a sanitizer report, another exception, a timeout, running out of memory) is a
// finding. A decoded Metadata must survive an encode/decode round trip unchanged. The same
// bytes also go to the parser of the checksum file beside '.metadata'. Seeds:
// tests/fuzz/corpus/metadata (Python DCP and dcp '.metadata' files).
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "format/metadata_checksum.h"
#include "format/metadata_codec.h"
#include "fuzz/refused.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcp::fuzz::returns_or_refuses([&] {
    return dcp::detail::decode_metadata_checksum(
        std::string(reinterpret_cast<const char*>(data), size), "'.metadata.checksum'");
  });
  dcp::Metadata metadata;
  try {
    metadata =
        dcp::detail::decode_metadata(reinterpret_cast<const char*>(data), size, "'.metadata'");
  } catch (const c10::Error&) {
    return 0;  // refused: the expected outcome for almost every input
  }
  // What decodes must encode, and decode again to the same value.
  const std::string again = dcp::detail::encode_metadata(metadata);
  const dcp::Metadata round_trip =
      dcp::detail::decode_metadata(again.data(), again.size(), "re-encoded '.metadata'");
  if (!(round_trip == metadata)) std::abort();
  return 0;
}
