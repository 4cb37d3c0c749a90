// NcclCommunicator on one GPU (label 'gpu'): bootstrap through a single-process communicator,
// broadcast a device buffer, and check its bytes. Skipped on machines without a CUDA device.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "dcp/communicator.h"
#include "dcp/nccl_communicator.h"

namespace dcp {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCommunicatorTest, BroadcastsADeviceBufferFromRoot) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device on this machine";
  SingleProcessCommunicator bootstrap;
  NcclCommunicator comm(bootstrap, 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> host(1024);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  at::Tensor t = at::from_blob(device, {1024}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  comm.broadcast_tensor(t, 0);
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, back.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(device);
}

}  // namespace
}  // namespace dcp
