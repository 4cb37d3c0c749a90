// Read once, broadcast (LoadOptions::read_once): a tensor box that every rank of a load reads
// identically (a replicated tensor, a DDP model on every rank) is read from storage by one rank
// and broadcast to the others over the communicator, instead of every rank reading the same
// bytes. Note [Read once, broadcast] in shared_reads.cpp has the steps.
//
// plan_shared_reads runs on the coordinator; a SharedReadExchange lives on every rank for one
// load. Thread-safety: the exchange's planner() is called from the storage's IO threads
// (as any LoadPlanner); everything else from the thread that runs dcp::load.
#pragma once

#include <c10/core/ScalarType.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "dcp/communicator.h"
#include "dcp/metadata.h"
#include "dcp/planner.h"

namespace dcp::detail {

/// One box that every rank reads: `root` reads it from storage, the others receive it.
struct SharedRead {
  int root = 0;
  int64_t nbytes = 0;                               // the box's bytes in the saved dtype
  c10::ScalarType dtype = c10::ScalarType::Float;   // the saved dtype
  ReadItem item;  // this rank's read item (destination); the storage side is every rank's
};

/// Coordinator, after the global load plan: takes out of `plans` the tensor reads that every
/// rank has exactly once with the same saved chunk, offsets and lengths, and returns each
/// rank's list of them. Every list has the same roots, sizes and order; only each rank's
/// destination differs. The list is in storage order (file, offset); each root gets runs of it
/// so that every rank reads about the same bytes. With fewer than two plans nothing is shared.
std::vector<std::vector<SharedRead>> plan_shared_reads(std::vector<LoadPlan>& plans,
                                                       const Metadata& metadata);

/// One rank's part of the shared reads of one load.
class SharedReadExchange {
 public:
  /// `planner` (borrowed) is the load's planner; `reads` this rank's list.
  SharedReadExchange(std::vector<SharedRead> reads, LoadPlanner& planner, int rank);
  ~SharedReadExchange();
  SharedReadExchange(const SharedReadExchange&) = delete;
  SharedReadExchange& operator=(const SharedReadExchange&) = delete;

  bool empty() const { return reads_.empty(); }
  /// What the storage reader reads: `own` plus the shared boxes this rank is the root of.
  /// Resolves their buffers (the destination itself when it can take the bytes as they are).
  LoadPlan reader_plan(LoadPlan own);
  /// The planner to read reader_plan() with: the shared boxes go to their buffers, everything
  /// else to the load's planner.
  LoadPlanner& planner();
  /// Collective over `comm`: runs `read` (the storage read of reader_plan()) on a second
  /// thread while this one broadcasts each shared box from its root, as soon as the root has
  /// read it, copies it into this rank's destination and commits it. Every rank joins every
  /// broadcast whatever fails (a root whose read failed sends what its buffer holds); then the
  /// read's error, else the first destination's, is raised.
  void read_and_exchange(Communicator& comm, const std::function<void()>& read);
  /// Bytes this rank read for the others (its roots) and received from them.
  int64_t sent_bytes() const { return sent_bytes_; }
  int64_t received_bytes() const { return received_bytes_; }

 private:
  class Router;
  struct Buffer {
    at::Tensor dest;    // the planner's destination (resolved once)
    at::Tensor bytes;   // contiguous, saved dtype, the box's shape: `dest` itself, or a temporary
  };
  Buffer& buffer(size_t i);
  void deliver(size_t i);
  void exchange(Communicator& comm);
  void mark_read(size_t i);
  bool wait_read(size_t i);  // false when the read ended without it

  std::vector<SharedRead> reads_;
  LoadPlanner& planner_;
  int rank_;
  std::vector<Buffer> buffers_;  // one per read, resolved when first needed
  std::unique_ptr<Router> router_;
  std::mutex mu_;
  std::condition_variable read_cv_;
  std::vector<bool> read_;    // GUARDED_BY(mu_): a root box is in its buffer
  bool reading_done_ = false;  // GUARDED_BY(mu_)
  int64_t sent_bytes_ = 0;
  int64_t received_bytes_ = 0;
};

}  // namespace dcp::detail
