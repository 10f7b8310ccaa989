// Every collective of the Gloo backend against a direct computation of its
// definition, for every dtype, world sizes 1 to 4 and odd element counts
// (including 0 and uneven all-to-all splits with zero-sized pairs).

#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/conformance.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

class GlooCollectivesTest : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  void SetUp() override {
    size_ = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    CommOptions options;
    options.timeout = absl::Seconds(20);
    auto comms = ConnectGlooGroup(store_, size_, options);
    ASSERT_TRUE(comms.ok()) << comms.status();
    comms_ = *std::move(comms);
  }

  int size_ = 0;
  DType dtype_ = DType::kFloat32;
  InProcessKvStore store_;
  HostTestMemory memory_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

TEST_P(GlooCollectivesTest, AllReduceMatchesReference) { CheckAllReduce(Raw(comms_), dtype_, memory_); }
TEST_P(GlooCollectivesTest, AllGatherMatchesReference) { CheckAllGather(Raw(comms_), dtype_, memory_); }
TEST_P(GlooCollectivesTest, ReduceScatterMatchesReference) { CheckReduceScatter(Raw(comms_), dtype_, memory_); }
TEST_P(GlooCollectivesTest, AllToAllUnevenSplitsMatchReference) {
  CheckAllToAllUneven(Raw(comms_), dtype_, memory_);
}
TEST_P(GlooCollectivesTest, BroadcastFromEveryRoot) { CheckBroadcast(Raw(comms_), dtype_, memory_); }
TEST_P(GlooCollectivesTest, BarrierWaitsForEveryRank) { CheckBarrier(Raw(comms_)); }
TEST_P(GlooCollectivesTest, StartedCollectivesMatchBlockingOnes) {
  CheckStartedCollectives(Raw(comms_), dtype_, memory_);
}

INSTANTIATE_TEST_SUITE_P(
    SizesAndDTypes, GlooCollectivesTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32,
                                         DType::kInt64)),
    [](const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
      return absl::StrCat("world", std::get<0>(info.param), "_", DTypeName(std::get<1>(info.param)));
    });

TEST(GlooValidationTest, RejectsMismatchedArguments) {
  InProcessKvStore store;
  auto comms = ConnectGlooGroup(store, 1, CommOptions());
  ASSERT_TRUE(comms.ok()) << comms.status();
  Communicator& c = *(*comms)[0];
  std::vector<float> f(8);
  std::vector<int32_t> i(8);
  TensorView fv = MakeView(f.data(), DType::kFloat32, {8});
  TensorView iv = MakeView(i.data(), DType::kInt32, {8});
  EXPECT_EQ(c.AllGather(fv, iv).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllGather(fv, MakeView(f.data(), DType::kFloat32, {4})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(iv, ReduceOp::kAvg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(fv, 1).code(), absl::StatusCode::kInvalidArgument);
  const int64_t too_many[] = {9};
  EXPECT_EQ(c.AllToAll(fv, too_many, MakeView(i.data(), DType::kFloat32, {8}), too_many).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(MakeView(f.data(), DType::kFloat32, {8}, Device::kCuda), ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(MakeView(f.data(), DType::kFloat8E4M3, {8}), ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  // Bad arguments are the caller's error, not the group's: it stays usable.
  EXPECT_TRUE(c.health().ok());
  EXPECT_TRUE(c.AllReduce(fv, ReduceOp::kSum).ok());
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
