// dcp::async_save: a checkpoint that blocks training only while the state is copied into
// staging memory; writing, result gathering and the metadata commit run on a background
// worker. Python's torch.distributed.checkpoint.async_save with a stager.
//
//   auto stager = std::make_shared<dcp::DefaultStager>();   // keeps staging buffers warm
//   dcp::AsyncSaveOptions options;
//   options.comm = &comm;
//   options.stager = stager;
//   dcp::AsyncSaveFuture pending = dcp::async_save(state, "/shared/ckpt/step_6000", options);
//   ... train; the state may change right away ...
//   pending.get();   // the Metadata, or the save's error (on every rank)
//
// Python's use_async_staging (StagingOptions::use_async_staging): async_save returns once the
// staging buffers are allocated and the copies are queued; the copies run on the stager's
// staging thread. The state must then stay unchanged until pending.staging_completion() is
// ready (the training step's optimizer update waits for it):
//
//   auto pending = dcp::async_save(state, "/shared/ckpt/step_7000", options);
//   loss.backward();                       // reads the state, overlaps the staging copies
//   pending.staging_completion().wait();   // before optimizer.step() changes the state
//
// Memory: a DefaultStager keeps `max_in_flight` staging copies of the state (one per save that
// may be in flight), reused across saves of the same structure; CPU tensors are staged in
// ordinary host memory, device tensors in page-locked ("pinned") host memory through a copy on
// a side stream of their device.
//
// Lifetime: a save keeps running when its AsyncSaveFuture is destroyed. Destroying the
// DefaultStager waits for its pending saves (when async_save made the stager itself, the
// future owns it, so destroying the last copy of that future waits); returning from main
// therefore finishes pending saves. With MPI, wait for pending saves before MPI_Finalize. A
// process that ends abruptly with a save pending (_exit, a signal, a crash) abandons it: no
// '.metadata' is written, so the incomplete checkpoint stays invisible.
//
// Thread-safety: call async_save from one thread per rank (the training loop).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "dcp/checkpoint.h"
#include "dcp/storage.h"

namespace dcp {

struct StagingOptions {
  /// Saves that may be in flight at once; async_save waits for a free slot. Each slot holds one
  /// staging copy of the state, so staging memory is max_in_flight x the state's tensor bytes.
  int max_in_flight = 1;
  /// Stage device tensors in pinned host memory (faster, asynchronous device-to-host copies).
  bool use_pinned_memory = true;
  /// Threads that copy CPU tensors into their staging buffers, in pieces of 8 MiB (the calling
  /// thread is one of them); 0: the machine's hardware threads, at most 8.
  int copy_threads = 0;
  /// Python's use_async_staging: async_save returns before the staging copies are done (they
  /// run on the stager's staging thread). The caller must not change the state's tensors until
  /// AsyncSaveFuture::staging_completion() is ready; the stager keeps them alive until then.
  bool use_async_staging = false;
};

/// Counters of a DefaultStager, for tests and monitoring.
struct StagingStats {
  int64_t allocations = 0;     // staging buffers allocated
  int64_t bytes_allocated = 0;
  int64_t reuses = 0;          // tensors copied into an existing buffer
  int64_t saves = 0;
};

/// Owns the staging buffers and the background worker of asynchronous saves.
class DefaultStager {
 public:
  explicit DefaultStager(StagingOptions options = {});
  /// Waits for every pending save, then stops the worker. Never throws.
  ~DefaultStager();
  DefaultStager(const DefaultStager&) = delete;
  DefaultStager& operator=(const DefaultStager&) = delete;

  StagingStats stats() const;

 private:
  friend struct AsyncSaveAccess;
  struct Impl;  // the slots, the queue and the worker thread (async_save.cpp)
  std::unique_ptr<Impl> impl_;
};

namespace detail {
struct AsyncSaveTimes;  // staging and save seconds (async_save.cpp)
}  // namespace detail

/// The handle of one asynchronous save.
class AsyncSaveFuture {
 public:
  AsyncSaveFuture() = default;

  /// Blocks until the save has finished (successfully or not).
  void wait() const;
  /// Whether the save has finished.
  bool done() const;
  /// Waits, then returns the committed Metadata or rethrows the save's error.
  Metadata get() const;
  /// Ready once the state has been copied into staging memory (at once without
  /// use_async_staging); from then on the caller may change the state. Python's
  /// AsyncSaveResponse.staging_completion. A staging failure is rethrown by its get() as well as
  /// by this future's get().
  std::shared_future<void> staging_completion() const;
  /// Seconds the caller was blocked in async_save (waiting for a slot, then staging; with
  /// use_async_staging, the copies are not part of it).
  double blocking_seconds() const { return blocking_seconds_; }
  /// Waits for staging, then returns the seconds from the async_save call until the state was
  /// staged.
  double staging_seconds() const;
  /// Waits, then returns the seconds from the async_save call until the save finished.
  double save_seconds() const;

 private:
  friend struct AsyncSaveAccess;
  std::shared_future<Metadata> future_;
  std::shared_future<void> staged_;
  std::shared_ptr<DefaultStager> owned_stager_;  // set when async_save made the stager
  double blocking_seconds_ = 0;
  // Each time is written before the future that reports it becomes ready.
  std::shared_ptr<const detail::AsyncSaveTimes> times_;
};

/// dcp::save's options (the planner is kept until the background save ends; the communicator
/// is borrowed for the call only, since the background work runs on its duplicate), plus the
/// stager.
struct AsyncSaveOptions : SaveOptions {
  /// Staging buffers and worker, shared across saves; nullptr: a fresh stager for this save.
  std::shared_ptr<DefaultStager> stager;
};

/// Stages `state` (the caller may modify or free its tensors once this returns, or with
/// use_async_staging once staging_completion() is ready), then saves the staged copy in the
/// background into the directory `checkpoint_id`.
/// Every rank calls it, in the same order relative to its other collectives on `comm`.
/// Failures, staging ones included (an undefined tensor, memory exhausted), do not throw here:
/// they fail the returned future, and the same error reaches every rank's future, so that no
/// rank waits on a save another rank abandoned.
AsyncSaveFuture async_save(const StateDict& state, const std::string& checkpoint_id,
                           const AsyncSaveOptions& options = {});
/// The same through `writer`, which the background save keeps alive.
AsyncSaveFuture async_save(const StateDict& state, std::shared_ptr<StorageWriter> writer,
                           const AsyncSaveOptions& options = {},
                           const std::optional<std::string>& checkpoint_id = std::nullopt);

}  // namespace dcp
