// Internal helpers over dcp::Metadata shared by the save protocol and the '.metadata' decoder.
#pragma once

#include <utility>
#include <vector>

#include "dcp/metadata.h"

namespace dcp::detail {

/// Builds Metadata.storage_data from entries in any order; of equal keys the last one wins (as
/// repeated insert_or_assign would). Built from a sort on interned fqn ranks and offsets, then
/// hinted inserts, so millions of entries cost integer compares rather than string compares
/// per tree level.
std::map<MetadataIndex, StorageInfo> make_storage_data(
    std::vector<std::pair<MetadataIndex, StorageInfo>> entries);

}  // namespace dcp::detail
