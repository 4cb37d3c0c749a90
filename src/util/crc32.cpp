// crc32 (see crc32.h): ISA-L's crc32_gzip_refl is the zip CRC-32.
#include "util/crc32.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace dcp::detail {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {  // ISA-L takes a uint64_t length; chunk anyway to keep loops bounded
    const size_t step = std::min<size_t>(n, size_t{1} << 30);
    crc = crc32_gzip_refl(crc, p, step);
    p += step;
    n -= step;
  }
  return crc;
}

}  // namespace dcp::detail
