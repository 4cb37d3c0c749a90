// NcclCommunicator (see dcp/nccl_communicator.h). NCCL and CUDA return codes are translated in
// one place each (DCP_NCCL_CHECK, DCP_CUDA_CHECK); the NCCL communicator and the stream have
// one owner (NcclState), destroyed without throwing.
#include "dcp/nccl_communicator.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#define DCP_NCCL_CHECK(call)                                                              \
  do {                                                                                    \
    const ncclResult_t dcp_nccl_rc = (call);                                              \
    TORCH_CHECK(dcp_nccl_rc == ncclSuccess, "NCCL call ", #call, " failed: ",             \
                ncclGetErrorString(dcp_nccl_rc), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

#define DCP_CUDA_CHECK(call)                                                           \
  do {                                                                                 \
    const cudaError_t dcp_cuda_rc = (call);                                            \
    TORCH_CHECK(dcp_cuda_rc == cudaSuccess, "CUDA call ", #call, " failed: ",          \
                cudaGetErrorString(dcp_cuda_rc));                                      \
  } while (0)

namespace dcp {
namespace detail {

struct NcclState {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState() {
    if (comm != nullptr && ncclCommDestroy(comm) != ncclSuccess) {
      LOG(WARNING) << "NcclCommunicator: ncclCommDestroy failed";
    }
    if (stream != nullptr && cudaStreamDestroy(stream) != cudaSuccess) {
      LOG(WARNING) << "NcclCommunicator: cudaStreamDestroy failed";
    }
  }
};

}  // namespace detail

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, int device)
    : bootstrap_(bootstrap), state_(std::make_unique<detail::NcclState>()) {
  state_->device = device;
  ncclUniqueId id;
  std::string bytes;
  if (bootstrap_.rank() == 0) {
    DCP_NCCL_CHECK(ncclGetUniqueId(&id));
    bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  bytes = bootstrap_.broadcast(bytes, 0);
  TORCH_CHECK(bytes.size() == sizeof id, "NcclCommunicator: malformed unique id");
  std::memcpy(&id, bytes.data(), sizeof id);
  DCP_CUDA_CHECK(cudaSetDevice(device));
  DCP_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking));
  DCP_NCCL_CHECK(ncclCommInitRank(&state_->comm, bootstrap_.size(), id, bootstrap_.rank()));
}

NcclCommunicator::~NcclCommunicator() = default;

void NcclCommunicator::broadcast_tensor(at::Tensor& tensor, int root) {
  TORCH_CHECK(tensor.is_cuda() && tensor.is_contiguous(),
              "broadcast_tensor needs a contiguous CUDA tensor");
  DCP_CUDA_CHECK(cudaSetDevice(state_->device));
  void* data = tensor.data_ptr();
  const size_t nbytes = tensor.numel() * tensor.element_size();
  DCP_NCCL_CHECK(ncclBroadcast(data, data, nbytes, ncclUint8, root, state_->comm, state_->stream));
  DCP_CUDA_CHECK(cudaStreamSynchronize(state_->stream));
}

}  // namespace dcp
