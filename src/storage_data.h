// make_storage_data: Metadata.storage_data from every rank's write results (the save protocol)
// or from a '.metadata' whose entries are not in key order; StorageDataBuilder: the same from a
// '.metadata''s entries as the decoders meet them. Defined in metadata.cpp.
#pragma once

#include <utility>
#include <vector>

#include "dcp/metadata.h"

namespace dcp::detail {

/// Builds Metadata.storage_data from entries in any order; of equal keys the last one wins (as
/// repeated insert_or_assign would). Built from a sort on interned fqn ranks and offsets, so
/// millions of entries cost integer compares rather than string compares, then moved into the
/// map's array in that order.
StorageData make_storage_data(
    std::vector<std::pair<MetadataIndex, StorageInfo>> entries);

/// Metadata.storage_data from a '.metadata''s entries, in the file's order. dcp writes them in
/// key order, and those are appended and become the map as they are; Python writes them rank
/// by rank: from the first entry out of order on, make_storage_data sorts everything (equal
/// keys: the last one wins, as in a dict).
class StorageDataBuilder {
 public:
  /// `expected`: how many entries to make room for (a decoder counts the chunks and byte items
  /// of state_dict_metadata, which come first); only a hint.
  explicit StorageDataBuilder(size_t expected = 0) { ordered_.reserve(expected); }
  void add(MetadataIndex index, StorageInfo info);
  StorageData finish() &&;

 private:
  StorageData ordered_;  // while the entries come in key order
  std::vector<std::pair<MetadataIndex, StorageInfo>> unordered_;  // once out of order
};

}  // namespace dcp::detail
