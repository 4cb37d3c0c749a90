// The zip layout both of dcp's zip codecs use (APPNOTE.TXT 4.3): record signatures and the
// fixed sizes of the headers and end records. The reader (zip_directory.cpp) checks archives
// against them; the writer (zip_writer.cpp) emits them.
#pragma once

#include <cstdint>

namespace dcp::detail::zip {

// Signatures, as the little-endian 32-bit value that opens each structure.
inline constexpr uint32_t kLocalHeader = 0x04034b50;
inline constexpr uint32_t kDataDescriptor = 0x08074b50;
inline constexpr uint32_t kCentralEntry = 0x02014b50;
inline constexpr uint32_t kEndOfDirectory64 = 0x06064b50;
inline constexpr uint32_t kEndLocator64 = 0x07064b50;
inline constexpr uint32_t kEndOfDirectory = 0x06054b50;

// Fixed sizes in bytes, before any variable-length name, extra field or comment.
inline constexpr uint64_t kLocalHeaderSize = 30;
inline constexpr uint64_t kDataDescriptorSize = 16;  // signature, CRC-32, two 32-bit sizes
inline constexpr uint64_t kCentralEntrySize = 46;
inline constexpr uint64_t kEndOfDirectory64Size = 56;
inline constexpr uint64_t kEndLocator64Size = 20;
inline constexpr uint64_t kEndOfDirectorySize = 22;
inline constexpr uint64_t kMaxComment = 0xFFFF;

// General purpose flag bit 3: sizes and CRC-32 follow the data in a data descriptor.
inline constexpr uint64_t kDataDescriptorFlag = 0x8;

}  // namespace dcp::detail::zip
