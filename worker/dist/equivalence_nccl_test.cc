// Distributed equivalence on GPUs over NCCL (tag "gpu"): tables, outputs,
// gradients and FSDP buffers on the GPUs; the same check as the Gloo test.
// One GPU always; every GPU when there are at least two (FSDP groups of 2
// with replicas when the count is even).

#include "gtest/gtest.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/dist/equivalence_testing.h"

namespace recfleet {
namespace dist {
namespace {

comm::CommFactory Nccl(int rank) {
  return [rank](comm::KvStore& s, int r, int n) { return comm::ConnectNccl(s, r, n, rank, comm::CommOptions()); };
}

TEST(EquivalenceNcclTest, OneGpuMatchesOneHostRank) {
  ASSERT_GE(comm::CudaDeviceCount(), 1) << "this test needs a GPU";
  comm::CudaTestMemory memory;
  CheckDistributedEquivalence(1, 1, DenseOptimizer::kAdam, memory, Nccl);
}

TEST(EquivalenceNcclTest, EveryGpuMatchesOneHostRank) {
  const int gpus = comm::CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, have " << gpus;
  comm::CudaTestMemory memory;
  CheckDistributedEquivalence(gpus, gpus % 2 == 0 ? 2 : gpus, DenseOptimizer::kAdam, memory, Nccl);
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
