// libFuzzer target: the torch.save record readers on arbitrary bytes taken as one record of a
// '.distcp' file (zip directory check, every zip record's CRC-32 as dcp::verify checks them,
// the records found through that directory, version, data.pkl, storage geometry, CRC-32). Each
// reader must return or throw c10::Error. Seeds: tests/fuzz/corpus/record (records cut out of Python
// DCP and dcp data files).
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/torch_save.h"
#include "format/zip_directory.h"
#include "fuzz/refused.h"
#include "testing/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dcp::fuzz::returns_or_refuses;
  const dcp::testing::StringSource source(std::string(reinterpret_cast<const char*>(data), size));
  returns_or_refuses([&] { return dcp::detail::read_zip_directory(source); });
  returns_or_refuses([&] { dcp::detail::check_zip_records(source); });
  returns_or_refuses([&] { return dcp::detail::read_tensor_record(source); });
  returns_or_refuses([&] { return dcp::detail::read_tensor_archive(source); });
  returns_or_refuses([&] { return dcp::detail::read_value_archive(source); });
  return 0;
}
