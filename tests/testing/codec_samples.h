// Sample plans and Metadata for the codec tests: metadata_codec_test round-trips them through
// '.metadata' and the wire, and make_wire_corpus writes them as fuzz_wire's seeds. The plans
// cover a byte item, a shard with an index hint, a tensor of five dimensions (past Dims' four
// inline slots), planner_data paths of str and int keys, and a read whose storage name differs
// from its destination name.
#pragma once

#include <vector>

#include "dcp/metadata.h"
#include "dcp/planner.h"
#include "dcp/storage.h"

namespace dcp::testing {

/// Three write items: BYTE_IO "step", a SHARD of "layers.0.weight" (index hint 7, bf16,
/// requires_grad, channels-last) and a 5-d TENSOR "conv3d.weight"; storage_data "__3_",
/// planner_data for "step" and "layers.0.weight", usable.
SavePlan sample_save_plan();

/// The write results of sample_save_plan()'s first two items, in one file: "step" (8 bytes)
/// and the shard of "layers.0.weight" (12 bytes, stored as 20 with two transforms).
std::vector<WriteResult> sample_write_results();

/// A tensor read of the 5-d "conv3d.weight" (storage index hint 0).
ReadItem sample_read_item();

/// sample_read_item(); a read of "w" (index hint 3) into "model.w"; a BYTE_IO read of
/// "step"; storage_data "reader".
LoadPlan sample_load_plan();

/// A Metadata with every field: "w" (bf16, requires_grad, 4 x 3 in two chunks on two files),
/// a 0-d "scalar" (an offset past 2^32), a byte item "step", planner_data, storage_meta and a
/// version; state_dict_metadata in the order "w", "scalar", "step" (not sorted).
Metadata sample_metadata();

}  // namespace dcp::testing
