// Bytes for what ranks exchange during a save or load: local and final plans and write
// results (the wire format of src/util/wire.h; Metadata travels as its '.metadata' pickle).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dcp/planner.h"
#include "dcp/storage.h"
#include "protocol/shared_reads.h"

namespace dcp::detail {

std::string encode_save_plan(const SavePlan& plan);
SavePlan decode_save_plan(const std::string& bytes);
std::string encode_load_plan(const LoadPlan& plan);
LoadPlan decode_load_plan(const std::string& bytes);
/// A rank's final load plan with its shared reads (Note [Read once, broadcast]).
std::string encode_load_plan(const LoadPlan& plan, const std::vector<SharedRead>& shared);
std::pair<LoadPlan, std::vector<SharedRead>> decode_load_plan_with_shared(const std::string& bytes);
std::string encode_write_results(const std::vector<WriteResult>& results);
std::vector<WriteResult> decode_write_results(const std::string& bytes);

}  // namespace dcp::detail
