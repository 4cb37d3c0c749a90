// libFuzzer target: the torch.save record readers on arbitrary bytes taken as one record of a
// '.distcp' file (zip directory check, LibTorch's PyTorchStreamReader behind it, data.pkl,
// storage geometry, CRC-32). Each reader must return or throw c10::Error. Seeds:
// tests/fuzz/corpus/record (records cut out of Python DCP and dcp data files).
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/torch_save.h"
#include "format/zip_directory.h"
#include "testing/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const dcp::testing::StringSource source(std::string(reinterpret_cast<const char*>(data), size));
  try {
    (void)dcp::detail::read_zip_directory(source);
  } catch (const c10::Error&) {
  }
  try {
    (void)dcp::detail::read_tensor_record(source);
  } catch (const c10::Error&) {
  }
  try {
    (void)dcp::detail::read_tensor_archive(source);
  } catch (const c10::Error&) {
  }
  try {
    (void)dcp::detail::read_value_archive(source);
  } catch (const c10::Error&) {
  }
  return 0;
}
