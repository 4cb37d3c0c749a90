// DistWrapper: runs the steps of a save or load on every rank and carries each step's outcome
// through the communicator (Python's _DistWrapper). A step that fails on any rank raises the
// same error on every rank, naming the failing ranks; no rank is left waiting in a collective,
// because every rank always joins every collective of a step, failed or not.
//
// With one rank the steps run directly and errors propagate unchanged.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dcp/communicator.h"

namespace dcp::detail {

class DistWrapper {
 public:
  /// The error a step raises names the step and the failing ranks, with each failing rank's
  /// message; the caller adds which save or load it was (with_context).
  DistWrapper(Communicator& comm, int coordinator);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  bool is_coordinator() const { return comm_.rank() == coordinator_; }

  /// local() on every rank; the results, in rank order, to global() on the coordinator, which
  /// returns one result per rank; each rank gets its own.
  std::string reduce_scatter(
      const std::string& step, const std::function<std::string()>& local,
      const std::function<std::vector<std::string>(std::vector<std::string>)>& global);

  /// local() on every rank; global(all results) on the coordinator; its result on every rank.
  std::string all_reduce(const std::string& step, const std::function<std::string()>& local,
                         const std::function<std::string(std::vector<std::string>)>& global);

  /// fn() on the coordinator; its result on every rank.
  std::string broadcast(const std::string& step, const std::function<std::string()>& fn);

  /// fn() on every rank; all results on every rank.
  std::vector<std::string> all_gather(const std::string& step,
                                      const std::function<std::string()>& fn);

 private:
  [[noreturn]] void raise(const std::string& encoded_error) const;
  std::string broadcast_outcome(std::string outcome);
  std::string combine_failures(const std::string& step, const std::vector<std::string>& outcomes);
  std::string coordinator_failure(const std::string& step, const std::string& outcome);

  Communicator& comm_;
  int coordinator_;
};

}  // namespace dcp::detail
