// dcp::save and dcp::load: the save/load protocol that drives planners, storage and
// communicator, with Python DCP's call order (docs/format.md §6.4).
//
// Every rank of the communicator calls save (or load) with its own state dict; they return on
// every rank with the same outcome. Not thread-safe with respect to one communicator.
//
// Ownership, the same throughout dcp: what a call only uses while it runs is borrowed (the
// writer or reader passed by reference, the Communicator* in the options); what may be kept
// after the call returns is shared (std::shared_ptr: planners, which an async save keeps until
// it ends; async_save's writer; a storage wrapper's target; a stager).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcp/events.h"
#include "dcp/communicator.h"
#include "dcp/metadata.h"
#include "dcp/planner.h"
#include "dcp/state_dict.h"
#include "dcp/storage.h"

namespace dcp {

struct SaveOptions {
  /// Planner (shared: an async save keeps it); nullptr means a DefaultSavePlanner.
  std::shared_ptr<SavePlanner> planner;
  /// The ranks taking part (borrowed; must outlive the call). nullptr: this process alone.
  Communicator* comm = nullptr;
  /// Save from this process alone even when a communicator is given (Python's no_dist).
  bool no_dist = false;
  /// The rank that plans globally and commits the metadata.
  int coordinator_rank = 0;
  /// How long any collective of the save waits for the other ranks before failing with an
  /// error that names the ranks that never arrived (c10d's default, 30 minutes; 0: forever).
  /// Set on the communicator for the call (Communicator::set_timeout).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Called at the start and end of the save and of its phases (dcp/events.h). May be empty.
  EventHook on_event;
  /// false: Python's use_collectives=False. Every rank plans, writes and commits alone (with
  /// FileSystemWriter: its own "__{rank}.metadata"); the only collective is a final exchange
  /// of every rank's outcome. Not atomic across ranks. Loads merge the ranks' metadata, at any
  /// world size.
  bool use_collectives = true;
};

/// Renames the checkpoint's flat keys to the keys of the state being loaded, before planning,
/// so that a renamed or re-wrapped module still loads (resharding included). Each saved key is
/// renamed by the first of these that applies: `keys` (an exact match), the longest matching
/// prefix of `prefixes`, then `function`. Errors: a rule or key that matches nothing in the
/// checkpoint, and two saved keys that end up with one name.
struct KeyMapping {
  /// Saved-key prefix -> prefix in the state, e.g. {"module.", ""} for a DDP-wrapped save.
  std::vector<std::pair<std::string, std::string>> prefixes;
  /// Saved flat key -> flat key in the state.
  std::map<std::string, std::string> keys;
  /// Any other renaming: saved flat key -> flat key in the state (return it to keep it).
  std::function<std::string(const std::string&)> function;

  bool empty() const { return prefixes.empty() && keys.empty() && !function; }
};

/// What load does about keys that the state and the checkpoint do not share (after the key
/// mapping): "missing" keys are in the state but not in the checkpoint, "unexpected" keys are in
/// the checkpoint but not in the state. Megatron's StrictHandling, in the subset that matters.
enum class StrictHandling {
  kRaiseMissing,  // Python's behaviour and the default: missing keys raise, unexpected are fine
  kRaiseAll,      // both raise, naming the keys
  kWarnAll,       // neither raises; both are logged to stderr (one line each) and returned
  kReturnAll,     // neither raises; both are returned in LoadResult
};

/// What load reports back. The lists are filled (sorted) unless strict is kRaiseMissing.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

struct LoadOptions {
  /// Planner (shared, as in SaveOptions); nullptr means a DefaultLoadPlanner with
  /// `planner_options`.
  std::shared_ptr<LoadPlanner> planner;
  /// Options of the default planner (ignored when `planner` is set).
  DefaultLoadPlannerOptions planner_options;
  /// The ranks taking part (borrowed; must outlive the call). nullptr: this process alone.
  Communicator* comm = nullptr;
  /// Load in this process alone even when a communicator is given (Python's no_dist).
  bool no_dist = false;
  int coordinator_rank = 0;
  /// As SaveOptions::timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Called at the start and end of the load and of its phases (dcp/events.h). May be empty.
  EventHook on_event;
  /// Checkpoint keys -> state keys, applied before planning (see KeyMapping).
  KeyMapping key_mapping;
  /// Missing and unexpected keys (see StrictHandling). With kWarnAll and kReturnAll the
  /// default planner loads what the two share (allow_partial_load).
  StrictHandling strict = StrictHandling::kRaiseMissing;
  /// Read once, broadcast: a tensor box that every rank reads identically (a replicated
  /// tensor, a DDP model on every rank) is read from storage by one rank and broadcast to the
  /// others over `comm` (Note [Read once, broadcast]). Python reads it on every rank; false
  /// does the same here.
  bool read_once = true;
};

/// Saves `state` into the directory `checkpoint_id` with a FileSystemWriter. Returns the
/// checkpoint's metadata on every rank. Top-level Stateful values are saved as their
/// state_dict(). On failure nothing new becomes loadable and every rank
/// throws.
Metadata save(const StateDict& state, const std::string& checkpoint_id,
              const SaveOptions& options = {});
/// Saves through `writer`; a given `checkpoint_id` is passed to writer.reset().
Metadata save(const StateDict& state, StorageWriter& writer, const SaveOptions& options = {},
              const std::optional<std::string>& checkpoint_id = std::nullopt);

/// Loads the checkpoint in directory `checkpoint_id` into `state`: tensors are filled in
/// place (any world size, any sharding), non-tensor values are replaced, as in Python.
/// Top-level Stateful values get their state_dict() filled and handed to load_state_dict().
LoadResult load(StateDict& state, const std::string& checkpoint_id,
                const LoadOptions& options = {});
LoadResult load(StateDict& state, StorageReader& reader, const LoadOptions& options = {},
                const std::optional<std::string>& checkpoint_id = std::nullopt);

}  // namespace dcp
