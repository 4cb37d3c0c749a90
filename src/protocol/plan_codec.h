// Bytes for what ranks exchange during a save or load: local and final plans, write results and
// the Metadata (the wire format of src/util/wire.h). The Metadata travels in this format, not as
// its '.metadata' pickle: it decodes in a third of the pickle's time, with no object tree.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dcp/planner.h"
#include "dcp/storage.h"
#include "protocol/shared_reads.h"

namespace dcp::detail {

std::string encode_save_plan(const SavePlan& plan);
/// Every rank's final plan, as dcp::save's coordinator scatters them: a plan that shares its
/// planner_data with the previous plan reuses that plan's bytes (Note [Shared planner_data]).
std::vector<std::string> encode_save_plans(const std::vector<SavePlan>& plans);
SavePlan decode_save_plan(const std::string& bytes);
/// Every rank's plan, as dcp::save's coordinator receives them: a plan whose planner_data is
/// byte for byte the previous plan's shares its map (Note [Shared planner_data]).
std::vector<SavePlan> decode_save_plans(const std::vector<std::string>& encoded);
std::string encode_load_plan(const LoadPlan& plan);
LoadPlan decode_load_plan(const std::string& bytes);
/// A rank's final load plan with its shared reads (Note [Read once, broadcast]).
std::string encode_load_plan(const LoadPlan& plan, const std::vector<SharedRead>& shared);
std::pair<LoadPlan, std::vector<SharedRead>> decode_load_plan_with_shared(const std::string& bytes);
std::string encode_write_results(const std::vector<WriteResult>& results);
std::vector<WriteResult> decode_write_results(const std::string& bytes);
/// The Metadata the coordinator broadcasts in dcp::load (what it read) and dcp::save (what it
/// committed). Lossless: decode_metadata_message(encode_metadata_message(m)) == m, with
/// state_dict_metadata in the same order.
std::string encode_metadata_message(const Metadata& metadata);
/// The size of encode_metadata_message's bytes, computed without writing them (the encoder
/// writes into one buffer of this size).
size_t metadata_message_size(const Metadata& metadata);
Metadata decode_metadata_message(const std::string& bytes);

}  // namespace dcp::detail
