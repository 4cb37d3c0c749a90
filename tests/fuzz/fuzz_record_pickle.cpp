// libFuzzer target: a record's data.pkl. The input becomes the data.pkl of a well-formed
// torch.save archive (built with LibTorch's own zip writer, with a 64-byte storage "0"), so
// the mutations reach the restricted pickle reader and the value/tensor interpretation instead
// of dying in the zip layer (fuzz_record covers that). Each reader must return or throw
// c10::Error. Seeds: tests/fuzz/corpus/record_pickle (data.pkl of Python and dcp records).
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/torch_save.h"
#include "fuzz/refused.h"
#include "testing/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dcp::fuzz::returns_or_refuses;
  const std::string pkl(reinterpret_cast<const char*>(data), size);
  const dcp::testing::StringSource source(dcp::testing::archive_of(pkl, std::string(64, '\x5a')));
  returns_or_refuses([&] { return dcp::detail::read_tensor_archive(source); });
  returns_or_refuses([&] { return dcp::detail::read_value_archive(source); });
  return 0;
}
