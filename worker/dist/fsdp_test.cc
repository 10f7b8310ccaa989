#include "worker/dist/fsdp.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/testing.h"
#include "worker/dist/fsdp_testing.h"

namespace recfleet {
namespace dist {
namespace {

TEST(FlatShardLayoutTest, PadsToAMultipleOfTheGroup) {
  const FlatShardLayout l = FlatShardLayout::Make(10, 3);
  EXPECT_EQ(l.shard_numel, 4);
  EXPECT_EQ(l.padded_numel, 12);
  EXPECT_EQ(l.ShardOffset(2), 8);
  EXPECT_EQ(FlatShardLayout::Make(12, 3).padded_numel, 12);
  EXPECT_EQ(FlatShardLayout::Make(0, 4).shard_numel, 0);
}

// Six ranks: FSDP groups of 3 x 2 replicas, a parameter of 10 elements.
TEST(FsdpFlatParameterTest, GatherAndReduceOverGroupsAndReplicas) {
  comm::HostTestMemory memory;
  CheckFsdpGatherAndReduce(6, 3, memory, [](int) { return comm::LoopbackGloo(absl::Seconds(20)); });
}

TEST(FsdpFlatParameterTest, RejectsWrongShardSizes) {
  comm::InProcessKvStore store;
  auto comms = comm::ConnectGlooGroup(store, 1, comm::CommOptions());
  ASSERT_TRUE(comms.ok());
  auto fsdp = FsdpFlatParameter::Create(10, (*comms)[0].get(), nullptr);
  ASSERT_TRUE(fsdp.ok());
  std::vector<float> wrong(11), full(10);
  EXPECT_EQ(fsdp->AllGather(MakeView(wrong.data(), DType::kFloat32, {11}), MakeView(full.data(), DType::kFloat32, {10}))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FsdpFlatParameter::Create(10, nullptr, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
