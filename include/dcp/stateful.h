// dcp::Stateful: an object that hands its state to dcp::save and takes it back from dcp::load
// (Python's torch.distributed.checkpoint.stateful.Stateful). Put one as a top-level value of a
// StateDict: save calls state_dict() and writes what it returns under the value's key; load
// asks state_dict() for the destination, loads into it, then calls load_state_dict() with the
// filled dict, in that order, as Python does. Adapters for LibTorch modules and optimizers are
// in dcp/torch_state_dict.h; examples/libtorch_train.cpp shows a user-defined one.
//
// Thread-safety: save and load call the object on the calling thread (async_save too: before
// it returns).
#pragma once

#include "dcp/state_dict.h"

namespace dcp {

class Stateful {
 public:
  virtual ~Stateful() = default;
  /// The state to save, or the destination to load into: tensors that share storage with the
  /// object's own are filled in place by load.
  virtual StateDict state_dict() = 0;
  /// Called by load with the dict that state_dict() returned, filled from the checkpoint.
  virtual void load_state_dict(const StateDict& state_dict) = 0;
};

/// `state` with every top-level Stateful replaced by its state_dict() (what save writes and
/// load fills). Other values are shared, not copied (tensors keep their storage).
StateDict resolve_stateful(const StateDict& state);

/// Whether a top-level value of `state` is a Stateful.
bool has_stateful(const StateDict& state);

}  // namespace dcp
