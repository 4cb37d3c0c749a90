// State dicts for the multi-rank tests: every tensor is a deterministic function of its global
// index (make_tensor), laid out per rank by a DTensor-style layout, so any world size can check
// any other's checkpoint bit for bit.
#pragma once

#include <string>
#include <vector>

#include "dcp/dcp.h"

namespace dcp::testing {

/// How the sharded tensors of sharded_state() are laid out over `world` ranks.
enum class Layout {
  kRow,     // Shard(0) over all ranks
  kColumn,  // Shard(1) over all ranks
  kMesh2d,  // 2-D mesh (a, world / a) with [Shard(0), Shard(1)], a the largest factor <= sqrt
};

/// The full (unsharded) reference state: tensors of several shapes and dtypes (f32, bf16, i64),
/// including an uneven 10-row tensor, a 3-row one (empty shards on most ranks), a replicated
/// tensor and non-tensor values.
StateDict full_state();

/// Rank `rank`'s view of full_state() under `layout` (replicated entries stay whole tensors).
/// With `zeros`, every tensor is zero-filled and every non-tensor value None: a destination.
StateDict sharded_state(int rank, int world, Layout layout, bool zeros);

/// Empty when `actual` equals sharded_state(rank, world, layout, false); else the difference.
std::string check_sharded_state(const StateDict& actual, int rank, int world, Layout layout);

const char* layout_name(Layout layout);

/// Loads checkpoint `id` of `storage` on `world` in-process ranks into zeroed sharded_state()s
/// of `layout` and throws naming the first difference.
void load_in_process_and_check(MemoryStorage& storage, const std::string& id, int world,
                               Layout layout);

}  // namespace dcp::testing
