// make_storage_data: Metadata.storage_data from every rank's write results (the save protocol)
// or from a '.metadata' whose entries are not in key order; StorageDataBuilder: the same from a
// '.metadata''s entries as the decoders meet them. Defined in metadata.cpp.
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

/// Metadata.storage_data from a '.metadata''s entries, in the file's order. dcp writes them in
/// key order, and those go straight into the map; Python writes them rank by rank: at the
/// first entry out of order the map is taken apart and make_storage_data sorts everything
/// (equal keys: the last one wins, as in a dict).
class StorageDataBuilder {
 public:
  void add(MetadataIndex index, StorageInfo info);
  std::map<MetadataIndex, StorageInfo> finish() &&;

 private:
  std::map<MetadataIndex, StorageInfo> ordered_;
  std::vector<std::pair<MetadataIndex, StorageInfo>> unordered_;  // once out of order
};

}  // namespace dcp::detail
