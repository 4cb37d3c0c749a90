// NcclCommunicator: a Communicator whose byte-buffer collectives run over a bootstrap
// communicator (normally MpiCommunicator) and which adds NCCL collectives on device memory,
// for broadcasting replicated device tensors instead of every rank reading them from storage.
// Built only with DCP_WITH_NCCL (NCCL and CUDA headers present).
//
// REQUIRES: one CUDA device per rank. Thread-safety: one thread at a time.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "dcp/communicator.h"

namespace dcp {

namespace detail {
struct NcclState;  // owns the ncclComm_t and the CUDA stream (src/comm/nccl_communicator.cpp)
}

class NcclCommunicator final : public Communicator {
 public:
  /// Collective over `bootstrap` (borrowed; must outlive this object): rank 0 creates the NCCL
  /// unique id and broadcasts it, then every rank joins the NCCL communicator on CUDA `device`.
  NcclCommunicator(Communicator& bootstrap, int device);
  ~NcclCommunicator() override;

  /// Broadcasts the bytes of a contiguous CUDA tensor from `root` into the same tensor on every
  /// rank, on this communicator's stream; returns when the copy has finished.
  void broadcast_tensor(at::Tensor& tensor, int root);

  // Communicator (host buffers, through the bootstrap communicator):
  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  void barrier() override { bootstrap_.barrier(); }
  std::string broadcast(const std::string& data, int root) override {
    return bootstrap_.broadcast(data, root);
  }
  void broadcast_buffer(void* data, size_t nbytes, int root) override {
    bootstrap_.broadcast_buffer(data, nbytes, root);
  }
  std::vector<std::string> gather(const std::string& data, int root) override {
    return bootstrap_.gather(data, root);
  }
  std::string scatter(const std::vector<std::string>& data, int root) override {
    return bootstrap_.scatter(data, root);
  }
  std::vector<std::string> all_gather(const std::string& data) override {
    return bootstrap_.all_gather(data);
  }
  /// A duplicate of the bootstrap communicator (host collectives only).
  std::unique_ptr<Communicator> duplicate() override { return bootstrap_.duplicate(); }

 private:
  Communicator& bootstrap_;
  std::unique_ptr<detail::NcclState> state_;
};

}  // namespace dcp
