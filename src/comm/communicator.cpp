// Communicator's default broadcast_buffer, and SingleProcessCommunicator: every collective
// over one rank is a local copy.
#include "dcp/communicator.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace dcp {

void Communicator::broadcast_buffer(void* data, size_t nbytes, int root) {
  const bool is_root = rank() == root;
  const std::string out =
      broadcast(is_root ? std::string(static_cast<const char*>(data), nbytes) : std::string(), root);
  if (is_root) return;
  TORCH_CHECK(out.size() == nbytes, "broadcast_buffer: rank ", root, " sent ", out.size(),
              " bytes, rank ", rank(), " expected ", nbytes);
  if (nbytes > 0) std::memcpy(data, out.data(), nbytes);
}

std::string SingleProcessCommunicator::broadcast(const std::string& data, int root) {
  TORCH_CHECK(root == 0, "broadcast: root ", root, " out of range for 1 rank");
  return data;
}

std::vector<std::string> SingleProcessCommunicator::gather(const std::string& data, int root) {
  TORCH_CHECK(root == 0, "gather: root ", root, " out of range for 1 rank");
  return {data};
}

std::string SingleProcessCommunicator::scatter(const std::vector<std::string>& data, int root) {
  TORCH_CHECK(root == 0 && data.size() == 1, "scatter over 1 rank needs root 0 and 1 buffer");
  return data[0];
}

std::vector<std::string> SingleProcessCommunicator::all_gather(const std::string& data) {
  return {data};
}

std::unique_ptr<Communicator> SingleProcessCommunicator::duplicate() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace dcp
