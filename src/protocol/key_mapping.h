// Internal: applying LoadOptions::key_mapping to a checkpoint's metadata, and the missing /
// unexpected key report of LoadOptions::strict.
#pragma once

#include <string>
#include <vector>

#include "dcp/checkpoint.h"

namespace dcp::detail {

/// Renames the flat keys of `metadata` (state_dict_metadata, storage_data, planner_data) by
/// `mapping`. Throws c10::ValueError naming the rule for a rule or key that matched nothing,
/// and naming both saved keys for a collision. A no-op for an empty mapping.
void apply_key_mapping(Metadata& metadata, const KeyMapping& mapping);

/// The flat keys of `state` missing from `metadata`, and those of `metadata` that `state` does
/// not ask for, each sorted.
LoadResult compare_keys(const StateDict& state, const Metadata& metadata);

/// Acts on `result` as `strict` says: throws (kRaiseAll), logs (kWarnAll) or does nothing.
/// `rank` is named in messages.
void handle_key_report(const LoadResult& result, StrictHandling strict, int rank);

}  // namespace dcp::detail
