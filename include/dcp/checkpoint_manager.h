// dcp::CheckpointManager: the checkpoints of a training run under one root directory, one
// "step_<N>" directory per saved step, for training loops (like Orbax's CheckpointManager):
// save every k steps (synchronously or through async_save), keep the last n and every m-th,
// resume from the latest.
//
//   dcp::CheckpointManagerOptions options;
//   options.keep_last_n = 3;
//   options.comm = &comm;
//   dcp::CheckpointManager manager("/shared/run", options);
//   int64_t start = 0;
//   if (auto latest = manager.latest_step()) start = manager.load(state, *latest) + 1;
//   for (int64_t step = start; step < steps; ++step) {
//     train_step();
//     manager.save(step, state);  // saves when step % save_interval_steps == 0
//   }
//   manager.wait_until_finished();
//
// Guarantees: a step counts only once committed (its .metadata exists, Note [Re-save]);
// directories of saves that never committed (a crash midway) are ignored, and removed once a
// newer step has committed or when a manager starts. Old steps are removed only after a newer
// one has committed, by the coordinator alone, .metadata first (so a step is either loadable or
// invisible), and never the newest committed step. A directory that a save holds (its lock) is
// never removed. A dropped step's data files are removed on a background thread (Note
// [Background retention] in checkpoint_manager.cpp), which the next save(),
// wait_until_finished() and the destructor wait for.
//
// Collective: every rank calls every method in the same order (the coordinator lists the root
// and broadcasts what it saw, so the ranks agree even on storage with delayed visibility).
// One manager per root at a time. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dcp/async_save.h"
#include "dcp/checkpoint.h"
#include "dcp/communicator.h"

namespace dcp {

struct CheckpointManagerOptions {
  /// Committed steps to keep, newest first; older ones are removed after each commit.
  /// 0: keep all.
  int64_t keep_last_n = 0;
  /// Steps that are multiples of this are kept forever, whatever keep_last_n says. 0: none.
  int64_t keep_every_n_steps = 0;
  /// save(step) saves only steps that are multiples of this (unless forced). At least 1.
  int64_t save_interval_steps = 1;
  /// Save through async_save: save() returns after staging; the next save(), a load, or
  /// wait_until_finished() waits for it.
  bool async = false;
  /// The ranks taking part (borrowed; must outlive the manager). nullptr: this process alone.
  /// Overrides the comm of save_options and load_options.
  Communicator* comm = nullptr;
  /// Options of each save (async ones included) and load.
  AsyncSaveOptions save_options;
  LoadOptions load_options;
};

class CheckpointManager {
 public:
  /// Creates `root` when missing, and removes step directories of saves that never committed
  /// (unless a save holds them). Collective.
  explicit CheckpointManager(std::string root, CheckpointManagerOptions options = {});
  /// Waits for a pending async save; errors are logged to stderr, never thrown.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Whether save(step) would save: step is a multiple of save_interval_steps.
  bool should_save(int64_t step) const;
  /// Saves `state` as step `step` when should_save(step) or `force`; returns whether it did.
  /// Waits first for the previous async save. After the commit (for an async save: when the
  /// next call observes it), removes what the retention options no longer keep: invisible
  /// before this returns, its files removed in the background. Collective.
  bool save(int64_t step, const StateDict& state, bool force = false);
  /// Waits for a pending async save and applies retention, its background removal included;
  /// rethrows the save's error.
  void wait_until_finished();

  /// The committed steps, ascending. Collective.
  std::vector<int64_t> all_steps();
  /// The newest committed step; nullopt when there is none. Collective.
  std::optional<int64_t> latest_step();
  /// Loads step `step` (the latest committed one when nullopt) into `state` and returns the
  /// step loaded. Throws when there is no committed step. Collective.
  int64_t load(StateDict& state, std::optional<int64_t> step = std::nullopt);

  /// root/step_<step>.
  std::string directory(int64_t step) const;
  const std::string& root() const { return root_; }

 private:
  struct Listing;
  Listing list();              // collective
  void remove_unneeded(bool incomplete_only);  // the coordinator's part of retention
  void finish_pending();       // waits for the pending async save, then retention
  void join_removal();         // waits for retention's background removal, if any

  std::string root_;
  CheckpointManagerOptions options_;
  std::optional<AsyncSaveFuture> pending_;
  std::shared_ptr<DefaultStager> stager_;
  std::thread remover_;  // removes retired steps' files (Note [Background retention])
};

}  // namespace dcp
