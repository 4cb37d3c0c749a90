// In-memory torch.save archives for tests and fuzz targets: an ArchiveSource over a string, and
// an archive built around a given data.pkl with LibTorch's own zip writer.
#pragma once

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <string>

#include "format/torch_save.h"

namespace dcp::testing {

/// An archive held in memory.
class StringSource : public detail::ArchiveSource {
 public:
  explicit StringSource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, void* dst, size_t n) const override {
    TORCH_CHECK(offset <= bytes_.size() && n <= bytes_.size() - offset, "read past the end");
    if (n > 0) std::memcpy(dst, bytes_.data() + offset, n);
  }
  std::string describe() const override { return "'test' [0, " + std::to_string(size()) + ")"; }

 private:
  std::string bytes_;
};

/// A torch.save archive holding `pkl` as data.pkl and, when given, `storage` as data/0.
inline std::string archive_of(const std::string& pkl, const std::string& storage = "") {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter zip([&](const void* data, size_t n) -> size_t {
    if (data != nullptr)
      out.append(static_cast<const char*>(data), n);
    else
      out.append(n, '\0');
    return n;
  });
  zip.writeRecord("data.pkl", pkl.data(), pkl.size());
  zip.writeRecord("byteorder", "little", 6);
  if (!storage.empty()) zip.writeRecord("data/0", storage.data(), storage.size());
  zip.writeEndOfFile();
  return out;
}

}  // namespace dcp::testing
