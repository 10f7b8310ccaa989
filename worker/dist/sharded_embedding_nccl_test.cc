// Sharded embeddings with tables on GPUs over NCCL (tag "gpu"): the same
// check as the Gloo test, with one rank and, when there are at least two
// GPUs, one rank per GPU.

#include "gtest/gtest.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/dist/sharded_embedding_testing.h"

namespace recfleet {
namespace dist {
namespace {

// Rank r on GPU r; the connecting thread keeps that device current, which
// is where the collection allocates its tables.
GroupConnector Nccl() {
  return [](comm::KvStore& store, int rank, int size) {
    return comm::ConnectNccl(store, rank, size, rank, comm::CommOptions());
  };
}

TEST(ShardedEmbeddingNcclTest, OneGpu) {
  ASSERT_GE(comm::CudaDeviceCount(), 1) << "this test needs a GPU";
  comm::CudaTestMemory memory;
  CheckAgainstWholeTables(1, memory, Nccl());
}

TEST(ShardedEmbeddingNcclTest, EveryGpu) {
  const int gpus = comm::CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, have " << gpus;
  comm::CudaTestMemory memory;
  CheckAgainstWholeTables(gpus, memory, Nccl());
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
