// uuid4 (see uuid.h): 122 random bits from a generator seeded by std::random_device.
#include "util/uuid.h"

#include <cstdint>
#include <cstring>
#include <random>

namespace dcp::detail {

std::string uuid4() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  uint8_t b[16];
  for (int i = 0; i < 16; i += 8) {
    const uint64_t v = gen();
    std::memcpy(b + i, &v, 8);
  }
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}

}  // namespace dcp::detail
