// Communicator: the collectives the save/load protocol needs, over byte buffers, and no more.
// Implementations: SingleProcessCommunicator (one rank, no_dist), and (dcp/mpi.h, when built
// with MPI) MpiCommunicator.
//
// Every rank calls the same collectives in the same order. Thread-safety: one thread at a time
// per communicator, unless an implementation says otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace dcp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  /// Root's `data` on every rank.
  virtual std::string broadcast(const std::string& data, int root) = 0;
  /// Root's `nbytes` bytes at `data` into the `nbytes` bytes at `data` on every rank, in place
  /// (dcp::load's read-once broadcasts of tensor bytes). Every rank passes the same `nbytes`.
  /// The default goes through broadcast() and copies; implementations that can send from and
  /// receive into the buffer itself override it.
  virtual void broadcast_buffer(void* data, size_t nbytes, int root);
  /// Every rank's `data`, in rank order, on root; an empty vector elsewhere.
  virtual std::vector<std::string> gather(const std::string& data, int root) = 0;
  /// Root passes one buffer per rank; each rank gets its own. Non-roots pass an empty vector.
  virtual std::string scatter(const std::vector<std::string>& data, int root) = 0;
  /// Every rank's `data`, in rank order, on every rank.
  virtual std::vector<std::string> all_gather(const std::string& data) = 0;
  /// Every later collective of this communicator waits at most `timeout` for the other ranks
  /// (0: forever), then throws c10::Error naming the ranks that never arrived where the
  /// implementation can tell. After such an error the communicator is unusable: the ranks
  /// disagree on which collectives happened. dcp::save / dcp::load set it from their options.
  /// The default implementation has no deadline (and needs none when every collective is local).
  virtual void set_timeout(std::chrono::milliseconds timeout) {}
  /// A communicator over the same ranks whose messages never mix with this one's, usable from
  /// another thread while this one is in use (dcp::async_save runs its collectives on one).
  /// Collective: every rank calls it, in the same order. Throws when the implementation cannot
  /// be used from a second thread (MPI below MPI_THREAD_MULTIPLE).
  virtual std::unique_ptr<Communicator> duplicate() = 0;
};

/// One process, one rank: every collective is local (Python's no_dist=True).
class SingleProcessCommunicator final : public Communicator {
 public:
  // Communicator:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  std::string broadcast(const std::string& data, int root) override;
  std::vector<std::string> gather(const std::string& data, int root) override;
  std::string scatter(const std::vector<std::string>& data, int root) override;
  std::vector<std::string> all_gather(const std::string& data) override;
  std::unique_ptr<Communicator> duplicate() override;
};

}  // namespace dcp
