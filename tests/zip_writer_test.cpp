// ZipWriter (src/format/zip_writer.h): the torch.save archives dcp writes below 4 GiB must be
// byte for byte what LibTorch's PyTorchStreamWriter writes for the same records (Note [The zip
// writer]), so that Python's torch.load and DCP read them as their own.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/torch_save.h"
#include "format/zip_directory.h"
#include "format/zip_writer.h"
#include "testing/archive.h"

namespace dcp::detail {
namespace {

template <typename Write>
std::string collect(Write&& write) {
  std::string out;
  write([&](const void* d, size_t n) { out.append(static_cast<const char*>(d), n); });
  return out;
}

// The records of `archive` (but version and serialization id, which the writer adds), written
// again by PyTorchStreamWriter in the same order.
std::string rewritten_by_libtorch(const std::string& archive) {
  std::istringstream in(archive);  // IStreamAdapter does not own its stream
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_unique<caffe2::serialize::IStreamAdapter>(&in));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* d, size_t n) {
    if (d == nullptr) {
      out.append(n, '\0');
    } else {
      out.append(static_cast<const char*>(d), n);
    }
    return n;
  });
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/serialization_id") continue;
    auto [data, size] = reader.getRecord(name);
    writer.writeRecord(name, size ? data.get() : nullptr, size);
  }
  writer.writeEndOfFile();
  return out;
}

void expect_bytes_of_libtorch(const std::string& ours, const std::string& what) {
  const std::string theirs = rewritten_by_libtorch(ours);
  ASSERT_EQ(ours.size(), theirs.size()) << what;
  size_t first = 0;
  while (first < ours.size() && ours[first] == theirs[first]) ++first;
  EXPECT_EQ(first, ours.size()) << what << ": first differing byte " << first;
}

TEST(ZipWriterTest, BytesEqualPyTorchStreamWriters) {
  at::Tensor pk = at::arange(16, at::kInt);
  pk[0] = 0x08074b50;  // data that begins with a data descriptor's signature (PK\7\8)
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"arange(10)", at::arange(10, at::kFloat)},
      {"empty", at::empty({0}, at::kFloat)},
      {"one byte", at::ones({1}, at::kByte)},
      {"63 bytes", at::ones({63}, at::kChar)},
      {"64 bytes", at::ones({64}, at::kChar)},
      {"65 bytes", at::ones({65}, at::kChar)},
      {"bfloat16 matrix", at::rand({33, 7}).to(at::kBFloat16)},
      {"uint16 (v3 rebuild)", at::arange(100, at::kInt).to(at::kUInt16)},
      {"strided view", at::rand({8, 8}).t()},
      {"storage offset", at::rand({100}).narrow(0, 10, 50)},
      {"PK\\7\\8 data", pk},
      {"1 MiB", at::rand({1 << 18})},
  };
  for (const auto& entry : tensors) {
    const std::string& what = entry.first;
    const at::Tensor& t = entry.second;  // (clang cannot capture a structured binding)
    const std::string ours = collect([&](const ByteSink& sink) { write_tensor_archive(t, sink); });
    expect_bytes_of_libtorch(ours, what);
    const TensorRecord r = read_tensor_record(testing::StringSource(ours));
    EXPECT_EQ(r.data_offset % 64, 0u) << what;
    EXPECT_NO_THROW(check_zip_records(testing::StringSource(ours))) << what;
  }
  Dict d;
  d.insert_or_assign(Key("weights"), Value(at::rand({3, 4})));
  d.insert_or_assign(Key("step"), Value(int64_t{7}));
  d.insert_or_assign(Key("name"), Value(std::string("model")));
  d.insert_or_assign(Key("list"), Value(std::vector<Value>{at::ones({2}), at::empty({0}),
                                                           at::zeros({5}, at::kDouble)}));
  const std::string value = collect([&](const ByteSink& sink) { write_value_archive(d, sink); });
  expect_bytes_of_libtorch(value, "a dict of tensors and values");
}

TEST(ZipWriterTest, FitsStopsWellBeforeZip64Fields) {
  EXPECT_TRUE(ZipWriter::fits(0, 7));
  EXPECT_TRUE(ZipWriter::fits(uint64_t{3} << 30, 1000));
  EXPECT_FALSE(ZipWriter::fits(uint64_t{4} << 30, 7));
  EXPECT_FALSE(ZipWriter::fits(uint64_t{0xF0000000}, 7));  // no room for the headers
  EXPECT_FALSE(ZipWriter::fits(1000, 0x10000));            // the end record's 16-bit counts
}

TEST(ZipWriterTest, SinkFailuresPropagateAsTheSinksException) {
  size_t calls = 0;
  const ByteSink failing = [&](const void*, size_t) {
    if (++calls == 3) throw std::runtime_error("No space left on device");
  };
  try {
    write_tensor_archive(at::rand({1000}), failing);
    ADD_FAILURE() << "the sink's failure was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "No space left on device");
  }
  EXPECT_EQ(calls, 3u);  // nothing written after the failure
}

}  // namespace
}  // namespace dcp::detail
