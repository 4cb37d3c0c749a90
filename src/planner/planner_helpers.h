// Stateless planning steps shared by the default planners (Python's planner_helpers,
// _dedup_save_plans and default_planner module functions). Pure functions, no IO.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner.h"

namespace dcp::detail {

/// Removes duplicates of replicated items (equal MetadataIndex on several ranks), keeping each
/// on one rank: the one with the fewest bytes so far (ties: lowest rank), or always the lowest
/// rank when `save_to_lowest_rank` (docs/format.md §6.2).
std::vector<SavePlan> dedup_save_plans(std::vector<SavePlan> plans, bool save_to_lowest_rank);

/// Builds the global Metadata from the (de-duplicated) plans, rewriting each tensor item's
/// index hint to its chunk position; merges planner_data (docs/format.md §6.3). Throws
/// c10::ValueError when chunks leave the tensor's bounds, overlap, or (with more than one plan)
/// do not cover it.
std::pair<std::vector<SavePlan>, Metadata> create_default_global_save_plan(
    std::vector<SavePlan> plans);

/// Python's _compare_save_plans, stricter: the same items (type, fqn, offset, index hint,
/// chunk, global size and tensor properties, in order), the same planner_data and
/// storage_data, and the same usability. Python ignores dtypes and planner_data, so a save
/// that only changed a dtype would reuse a stale plan; dcp does not.
bool compare_save_plans(const SavePlan& a, const SavePlan& b);

/// Python's _validate_global_plan: returns a description of the first problem, or "".
std::string validate_global_plan(const Metadata& metadata, size_t num_plans);

/// The checks of one tensor's saved chunks: dimensions, non-negative sizes and offsets inside
/// the shape (with checked arithmetic), no two chunks overlapping, and with `require_cover`
/// every element covered (a 0-d tensor: one chunk). "" when sound, else the first problem.
std::string validate_chunks(const std::string& fqn, const TensorStorageMetadata& t,
                            bool require_cover);

/// The reads that fill `local_chunks` (destination boxes of tensor `fqn`, in global offsets)
/// from the saved chunks in `saved` (docs/format.md §6.5).
std::vector<ReadItem> create_read_items_for_chunk_list(
    const std::string& fqn, const TensorStorageMetadata& saved,
    const std::vector<ChunkStorageMetadata>& local_chunks);

/// The key in `candidates` closest to `key` (renames, prefixes, edit distance), or "" when
/// nothing is reasonably close.
std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace dcp::detail
