// Converting between a DCP checkpoint and one torch.save file, as Python's
// torch.distributed.checkpoint.format_utils does (dcp_to_torch_save, torch_save_to_dcp). The
// torch.save file holds the nested state dict; torch.load reads it (weights_only included),
// and dcp reads files torch.save wrote from values made of None, bool, int, float, str,
// bytes, list, tuple, dict, OrderedDict, torch.Size and tensors.
#pragma once

#include <string>

#include "dcp/state_dict.h"

namespace dcp {

/// Loads the whole checkpoint in directory `checkpoint_id` (no destination needed:
/// EmptyStateDictLoadPlanner) and writes it to `torch_save_path` as torch.save(state_dict)
/// would, through a temporary file renamed into place.
void dcp_to_torch_save(const std::string& checkpoint_id, const std::string& torch_save_path);

/// Reads a torch.save file whose top-level value is a dict and saves it as a DCP checkpoint
/// into directory `checkpoint_id` (this process alone).
void torch_save_to_dcp(const std::string& torch_save_path, const std::string& checkpoint_id);

/// Reads a torch.save file: its top-level value (tensors and plain values).
Value torch_load(const std::string& torch_save_path);
/// Writes `value` to `torch_save_path` as torch.save(value), through a temporary file.
void torch_save(const Value& value, const std::string& torch_save_path);

}  // namespace dcp
