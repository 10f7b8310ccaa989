// The NCCL backend on real GPUs (tag "gpu"): the same conformance checks as
// the Gloo backend, with one rank (always) and with one rank per visible GPU
// (when there are at least two), plus its failure paths.

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/conformance.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ConnectNcclGroup(KvStore& store, int size,
                                                                            const CommOptions& options) {
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> results(size);
  RunOnThreads(size, [&](int r) { results[r] = ConnectNccl(store, r, size, r, options); });
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    comms.push_back(*std::move(r));
  }
  return comms;
}

void RunAllChecks(int size) {
  InProcessKvStore store;
  auto comms = ConnectNcclGroup(store, size, CommOptions());
  ASSERT_TRUE(comms.ok()) << comms.status();
  CudaTestMemory memory;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(absl::StrCat("world ", size, " dtype ", DTypeName(dtype)));
    CheckAllReduce(Raw(*comms), dtype, memory);
    CheckAllGather(Raw(*comms), dtype, memory);
    CheckReduceScatter(Raw(*comms), dtype, memory);
    CheckAllToAllUneven(Raw(*comms), dtype, memory);
    CheckBroadcast(Raw(*comms), dtype, memory);
    CheckStartedCollectives(Raw(*comms), dtype, memory);
  }
  CheckBarrier(Raw(*comms));
}

TEST(NcclCommunicatorTest, OneRankConformance) {
  ASSERT_GE(CudaDeviceCount(), 1) << "this test needs a GPU";
  RunAllChecks(1);
}

TEST(NcclCommunicatorTest, OneRankPerGpuConformance) {
  const int gpus = CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, have " << gpus;
  RunAllChecks(gpus);
}

TEST(NcclCommunicatorTest, RejectsHostBuffers) {
  ASSERT_GE(CudaDeviceCount(), 1);
  InProcessKvStore store;
  auto comm = ConnectNccl(store, 0, 1, 0, CommOptions());
  ASSERT_TRUE(comm.ok()) << comm.status();
  float x = 1;
  EXPECT_EQ((*comm)->AllReduce(MakeView(&x, DType::kFloat32, {1}), ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->health().ok());
}

TEST(NcclCommunicatorTest, RendezvousFailsWhenRankZeroNeverArrives) {
  ASSERT_GE(CudaDeviceCount(), 1);
  InProcessKvStore store;
  CommOptions options;
  options.timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto comm = ConnectNccl(store, 1, 2, 0, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Rank 1 publishes nothing and never joins: rank 0's init cannot complete,
// and the deadline aborts it instead of hanging.
TEST(NcclCommunicatorTest, InitTimesOutWhenAPeerNeverJoins) {
  ASSERT_GE(CudaDeviceCount(), 1);
  InProcessKvStore store;
  CommOptions options;
  options.timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto comm = ConnectNccl(store, 0, 2, 0, options);
  EXPECT_FALSE(comm.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << comm.status();
}

TEST(NcclCommunicatorTest, AbortBreaksTheCommunicator) {
  ASSERT_GE(CudaDeviceCount(), 1);
  InProcessKvStore store;
  auto comm = ConnectNccl(store, 0, 1, 0, CommOptions());
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->Barrier().ok());
  (*comm)->Abort("test");
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
