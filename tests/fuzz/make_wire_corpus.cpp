// Writes the seed corpus of fuzz_wire (tests/fuzz/corpus/wire): one message of each kind the
// wire decoders read, as dcp's encoders write them, each after the byte that makes fuzz_wire
// pick its decoder. The plans, write results and Metadata are the codec tests' samples
// (testing/codec_samples.h); the messages cover every optional field present and absent,
// dimensions past Dims' four inline slots, planner_data, shared reads, transform descriptors
// and repeated names (Note [Repeated names]).
//
//   build/tests/make_wire_corpus tests/fuzz/corpus/wire
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "protocol/plan_codec.h"
#include "testing/codec_samples.h"

namespace {

using namespace dcp;          // NOLINT(google-build-using-namespace): a tool's names
using namespace dcp::detail;  // NOLINT(google-build-using-namespace)

void write(const std::string& dir, const std::string& name, uint8_t kind,
           const std::string& message) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.put(static_cast<char>(kind));
  out.write(message.data(), static_cast<std::streamsize>(message.size()));
  TORCH_CHECK(out.good(), "cannot write '", path, "'");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_wire_corpus <corpus dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  const SavePlan plan = dcp::testing::sample_save_plan();
  write(dir, "save_plan", 0, encode_save_plan(plan));
  write(dir, "save_plan_empty", 0, encode_save_plan(SavePlan{}));
  const LoadPlan load = dcp::testing::sample_load_plan();
  write(dir, "load_plan", 1, encode_load_plan(load));
  write(dir, "load_plan_shared", 2,
        encode_load_plan(load, {SharedRead{1, 48, c10::ScalarType::Half,
                                           dcp::testing::sample_read_item()}}));
  write(dir, "write_results", 3, encode_write_results(dcp::testing::sample_write_results()));
  Metadata md = dcp::testing::sample_metadata();
  md.storage_data.begin()->second.transform_descriptors = {"zstd"};
  write(dir, "metadata", 4, encode_metadata_message(md));
  Metadata bare = md;
  bare.planner_data.reset();
  bare.storage_meta.reset();
  bare.version.reset();
  write(dir, "metadata_bare", 4, encode_metadata_message(bare));
  return 0;
}
