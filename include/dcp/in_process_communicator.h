// InProcessCommunicator: N threads of one process acting as N ranks. It runs the real
// save/load protocol without mpirun, so multi-rank logic is tested fast and deterministically.
//
// Usage: one InProcessGroup(world_size) shared by all threads; thread r uses
// InProcessCommunicator(group, r). Every thread must call the same collectives in the same
// order (as with MPI). Thread-safety: each communicator is used by its own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcp/communicator.h"

namespace dcp {

/// The rendezvous shared by the ranks of an in-process world.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  int size() const { return size_; }

  /// Deposits `data` for `rank`, waits for every rank, and returns all deposits (rank order).
  /// With a timeout (0: none), throws after waiting that long, naming the ranks that never
  /// arrived; the group is then broken and every later exchange throws at once.
  std::vector<std::string> exchange(int rank, std::string data,
                                    std::chrono::milliseconds timeout = {});
  /// The group of `rank`'s next duplicate: the k-th call of every rank returns the same group.
  std::shared_ptr<InProcessGroup> next_child(int rank);

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_;     // guarded by mu_
  std::vector<bool> present_;          // guarded by mu_: who deposited in this round
  std::string broken_;                 // guarded by mu_: why the group is unusable, or ""
  std::vector<std::string> published_;  // guarded by mu_: the last completed round
  int arrived_ = 0;                     // guarded by mu_
  int leaving_ = 0;                     // guarded by mu_: ranks yet to read published_
  uint64_t generation_ = 0;             // guarded by mu_
  std::vector<size_t> next_child_;      // guarded by mu_: per rank, duplicates taken so far
  std::vector<std::shared_ptr<InProcessGroup>> children_;  // guarded by mu_
};

class InProcessCommunicator final : public Communicator {
 public:
  /// REQUIRES: 0 <= rank < group.size(); `group` outlives the communicator.
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank);

  // Communicator:
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void barrier() override;
  std::string broadcast(const std::string& data, int root) override;
  std::vector<std::string> gather(const std::string& data, int root) override;
  std::string scatter(const std::vector<std::string>& data, int root) override;
  std::vector<std::string> all_gather(const std::string& data) override;
  std::unique_ptr<Communicator> duplicate() override;
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
  std::chrono::milliseconds timeout_{0};
};

/// Runs fn(comm) on `world_size` threads, one per rank, and rethrows the first failure (after
/// every thread has finished).
void run_in_process(int world_size, const std::function<void(Communicator&)>& fn);

}  // namespace dcp
