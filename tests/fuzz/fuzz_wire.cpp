// libFuzzer target: the wire decoders of protocol/plan_codec.h (what ranks send each other
// during a save or load) on arbitrary bytes. The first byte picks the message kind: a save
// plan, a load plan, a load plan with its shared reads, write results, or the broadcast
// Metadata; the rest is the message. Every input must either decode or be refused with
// c10::Error; anything else (a crash, a sanitizer report, an allocation past -rss_limit_mb) is
// a finding. What decodes must encode to a message that decodes and encodes to the same bytes
// again (the encoders' form is a fixed point), and the broadcast Metadata's precomputed size
// must be exact. Seeds: tests/fuzz/corpus/wire, one message of each kind as dcp's encoders
// write them (make_wire_corpus).
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "planner/planner_helpers.h"
#include "protocol/plan_codec.h"

namespace {

using namespace dcp;          // NOLINT(google-build-using-namespace): a test's names
using namespace dcp::detail;  // NOLINT(google-build-using-namespace)

void require(bool ok) {
  if (!ok) std::abort();
}

// Decodes `bytes` as message kind `kind` and returns what the decoded object encodes to;
// throws c10::Error where the decoder refuses the bytes.
std::string round_trip(uint8_t kind, const std::string& bytes) {
  switch (kind) {
    case 0: {
      const SavePlan plan = decode_save_plan(bytes);
      // The coordinator's path: two ranks' plans, the second sharing the first's planner_data.
      const std::vector<SavePlan> both = decode_save_plans({bytes, bytes});
      require(both.size() == 2 && compare_save_plans(both[0], plan) &&
              compare_save_plans(both[1], plan));
      const std::string out = encode_save_plan(plan);
      require(encode_save_plans(both) == std::vector<std::string>({out, out}));
      return out;
    }
    case 1:
      return encode_load_plan(decode_load_plan(bytes));
    case 2: {
      const auto [plan, shared] = decode_load_plan_with_shared(bytes);
      return encode_load_plan(plan, shared);
    }
    case 3:
      return encode_write_results(decode_write_results(bytes));
    default: {
      const Metadata metadata = decode_metadata_message(bytes);
      const std::string out = encode_metadata_message(metadata);
      require(metadata_message_size(metadata) == out.size());
      require(decode_metadata_message(out) == metadata);
      return out;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t kind = data[0] % 5;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string once;
  try {
    once = round_trip(kind, bytes);
  } catch (const c10::Error&) {
    return 0;  // refused
  }
  // The encoders' form decodes, and encodes to itself.
  require(round_trip(kind, once) == once);
  return 0;
}
