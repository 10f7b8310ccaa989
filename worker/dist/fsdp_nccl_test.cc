// FSDP over NCCL (tag "gpu"): the same check as the Gloo test, with one rank
// and, when there are at least two GPUs, one rank per GPU (FSDP groups of 2
// with replicas when the count is even).

#include "gtest/gtest.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/dist/fsdp_testing.h"

namespace recfleet {
namespace dist {
namespace {

comm::CommFactory NcclOnDevice(int device) {
  return [device](comm::KvStore& s, int r, int n) { return comm::ConnectNccl(s, r, n, device, comm::CommOptions()); };
}

TEST(FsdpNcclTest, OneGpu) {
  ASSERT_GE(comm::CudaDeviceCount(), 1) << "this test needs a GPU";
  comm::CudaTestMemory memory;
  CheckFsdpGatherAndReduce(1, 1, memory, NcclOnDevice);
}

TEST(FsdpNcclTest, EveryGpu) {
  const int gpus = comm::CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, have " << gpus;
  comm::CudaTestMemory memory;
  CheckFsdpGatherAndReduce(gpus, gpus % 2 == 0 ? 2 : gpus, memory, NcclOnDevice);
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
