// '.metadata' bytes <-> dcp::Metadata: the pickle of Python's Metadata dataclasses
// (docs/format.md §2), written with our pickle writer and read with the restricted reader.
#pragma once

#include <string>

#include "dcp/metadata.h"

namespace dcp::detail {

/// The pickle Python's pickle.load turns into torch.distributed.checkpoint.metadata.Metadata.
/// Only the globals of docs/format.md §2 appear in it.
std::string encode_metadata(const Metadata& metadata);

/// Parses a '.metadata' pickle written by dcp or by Python DCP (any 2.x layout: both
/// TensorProperties locations, with or without storage_meta/version, protocols 2 to 5).
/// Throws c10::Error naming `source` on anything malformed or unexpected.
Metadata decode_metadata(const char* data, size_t size, const std::string& source);

}  // namespace dcp::detail
