// '.metadata' bytes <-> dcp::Metadata: the pickle of Python's Metadata dataclasses
// (docs/format.md §2), written with our pickle writer and read by one of two decoders: the
// direct one (format/metadata_direct.cpp) where it can, else the restricted reader's object
// tree (format/pickle.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "dcp/metadata.h"

namespace dcp::detail {

/// The pickle Python's pickle.load turns into torch.distributed.checkpoint.metadata.Metadata.
/// Only the globals of docs/format.md §2 appear in it.
std::string encode_metadata(const Metadata& metadata);
/// The same bytes, handed to `sink` in order, in pieces of at most about 1 MiB as they are
/// encoded: the pickle never sits in memory whole (FileSystemWriter's commit writes a
/// '.metadata' of hundreds of MiB this way). What `sink` throws propagates.
void encode_metadata(const Metadata& metadata, const std::function<void(std::string_view)>& sink);

/// Parses a '.metadata' pickle written by dcp or by Python DCP (any 2.x layout: both
/// TensorProperties locations, with or without storage_meta/version, protocols 2 to 5).
/// Throws c10::Error naming `source` on anything malformed or unexpected.
/// It first tries decode_metadata_direct and falls back to decode_metadata_tree where that
/// gives up, so it decodes or refuses exactly what the tree decoder does.
Metadata decode_metadata(const char* data, size_t size, const std::string& source);

/// The pickle read straight into a Metadata, without an object tree, for the opcode sequences
/// that dcp's encoder and Python's pickler emit for the dataclasses (a '.metadata' of millions
/// of entries: 2.7-4x faster than the tree, with half its peak memory). nullopt wherever the input
/// leaves them; never throws for input (only std::bad_alloc). What it returns is what
/// decode_metadata_tree returns for the same bytes (tests/fuzz/fuzz_metadata.cpp checks it).
std::optional<Metadata> decode_metadata_direct(const char* data, size_t size);

/// The restricted reader's object tree interpreted into a Metadata: every form the format
/// allows, and the error messages.
Metadata decode_metadata_tree(const char* data, size_t size, const std::string& source);

}  // namespace dcp::detail
