// MpiCommunicator: the Communicator over MPI. It works on its own duplicate of the caller's
// MPI_Comm, so a checkpoint's messages never mix with the trainer's, and it frees that
// duplicate on destruction. MPI error codes become c10::Error in one place (DCP_MPI_CHECK).
//
// REQUIRES: MPI is initialized (MPI_Init or MPI_Init_thread) before construction and finalized
// after destruction. Thread-safety: one thread at a time; a background thread needs
// MPI_THREAD_MULTIPLE or its own communicator used from that thread alone.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dcp/communicator.h"

namespace dcp {

class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates `comm` (collective over `comm`).
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  /// The duplicated communicator (owned by this object).
  MPI_Comm comm() const { return comm_; }

  // Communicator:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  std::string broadcast(const std::string& data, int root) override;
  /// MPI_Ibcast straight from and into `data`, in pieces of at most 1 GiB (MPI's int count).
  void broadcast_buffer(void* data, size_t nbytes, int root) override;
  std::vector<std::string> gather(const std::string& data, int root) override;
  std::string scatter(const std::vector<std::string>& data, int root) override;
  std::vector<std::string> all_gather(const std::string& data) override;
  /// MPI_Comm_dup; requires MPI_THREAD_MULTIPLE, since the duplicate is meant for another thread.
  /// (It has no deadline: MPI_Comm_dup blocks.)
  std::unique_ptr<Communicator> duplicate() override;
  /// Collectives become nonblocking MPI calls waited on with this deadline; a gather's root
  /// names the ranks whose contribution never came, the other ranks name the root.
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  // Waits for `requests` until the deadline; on timeout throws naming `what` and the ranks
  // `missing(done)` lists (done[i]: whether requests[i] completed).
  // `spin`: poll without pausing (bulk transfers, which progress only while polled).
  void wait(std::vector<MPI_Request>& requests, const char* what,
            const std::function<std::string(const std::vector<bool>&)>& missing,
            bool spin = false);

  std::chrono::milliseconds timeout_{0};
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace dcp
