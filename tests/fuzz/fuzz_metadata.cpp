// libFuzzer target: the '.metadata' decoders (the direct one, and the restricted pickle reader +
// Metadata interpretation) on arbitrary bytes. Every input must either decode or be refused
// with c10::Error; anything else (a crash, a sanitizer report, another exception, a timeout,
// running out of memory) is a finding. Where the direct decoder reads an input, the tree
// decoder must read the same Metadata from it. A decoded Metadata must survive an
// encode/decode round trip unchanged, through the direct decoder. The same bytes also go to the
// parser of the checksum file beside '.metadata'. Seeds: tests/fuzz/corpus/metadata (Python DCP
// and dcp '.metadata' files).
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "format/metadata_checksum.h"
#include "format/metadata_codec.h"
#include "fuzz/refused.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcp::fuzz::returns_or_refuses([&] {
    return dcp::detail::decode_metadata_checksum(
        std::string(reinterpret_cast<const char*>(data), size), "'.metadata.checksum'");
  });
  // Two decoders: the direct one may give up (nullopt) anywhere; what it reads, the object
  // tree's decoder must read too, and to the same Metadata.
  const char* bytes = reinterpret_cast<const char*>(data);
  const std::optional<dcp::Metadata> direct = dcp::detail::decode_metadata_direct(bytes, size);
  dcp::Metadata metadata;
  try {
    metadata = dcp::detail::decode_metadata_tree(bytes, size, "'.metadata'");
  } catch (const c10::Error&) {
    if (direct) std::abort();  // the direct decoder read what the tree refuses
    return 0;  // refused: the expected outcome for almost every input
  }
  if (direct && !(*direct == metadata)) std::abort();
  // What decodes must encode, and decode again to the same value, by the direct decoder.
  const std::string again = dcp::detail::encode_metadata(metadata);
  const std::optional<dcp::Metadata> round_trip =
      dcp::detail::decode_metadata_direct(again.data(), again.size());
  if (!round_trip || !(*round_trip == metadata)) std::abort();
  return 0;
}
