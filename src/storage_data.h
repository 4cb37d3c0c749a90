// make_storage_data: Metadata.storage_data from every rank's write results (the save protocol)
// or from a '.metadata' whose entries are not in key order (the decoder). Defined in
// metadata.cpp.
#pragma once

#include <map>
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
