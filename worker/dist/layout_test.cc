#include "worker/dist/layout.h"

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace dist {
namespace {

TEST(ParallelLayoutTest, FillsUnsetHints) {
  auto l = ParallelLayout::FromHints(8, {});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->fsdp_group_size, 8);
  EXPECT_EQ(l->replicas, 1);
  EXPECT_EQ(l->table_group_size, 8);
  l = ParallelLayout::FromHints(8, {0, 2, 0});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->fsdp_group_size, 4);
  EXPECT_EQ(l->table_group_size, 4);
  l = ParallelLayout::FromHints(8, {2, 0, 4});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->replicas, 4);
  EXPECT_EQ(l->table_group_size, 4);
}

TEST(ParallelLayoutTest, RejectsSizesThatDoNotDivideTheWorld) {
  EXPECT_FALSE(ParallelLayout::FromHints(8, {3, 0, 0}).ok());
  EXPECT_FALSE(ParallelLayout::FromHints(8, {2, 2, 0}).ok());
  EXPECT_FALSE(ParallelLayout::FromHints(8, {2, 4, 3}).ok());
  EXPECT_FALSE(ParallelLayout::FromHints(0, {}).ok());
}

// 4 ranks, FSDP 2 x replicas 2, tables over 4: the groups hold the expected
// members (checked by an OR-reduction of rank bits).
TEST(TrainingGroupsTest, BuildsDenseAndSparseGroups) {
  auto layout = ParallelLayout::FromHints(4, {2, 2, 4});
  ASSERT_TRUE(layout.ok());
  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(20);
  comm::RunOnThreads(4, [&](int rank) {
    auto transport = comm::GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok());
    auto groups = TrainingGroups::Build(*layout, rank, store, [&](comm::KvStore& s, int r, int n) {
      return comm::ConnectGloo(s, r, n, *transport, options);
    });
    ASSERT_TRUE(groups.ok()) << groups.status();
    // Summing distinct powers of two gives the set of members.
    auto members = [&](comm::Communicator* c) {
      int64_t sum = int64_t{1} << rank;
      EXPECT_TRUE(c->AllReduce(MakeView(&sum, DType::kInt64, {1}), comm::ReduceOp::kSum).ok());
      return sum;
    };
    EXPECT_EQ(members(groups->fsdp()), rank < 2 ? 0b0011 : 0b1100);
    EXPECT_EQ(members(groups->replica()), rank % 2 == 0 ? 0b0101 : 0b1010);
    EXPECT_EQ(members(groups->tables()), 0b1111);
    EXPECT_EQ(groups->table_replica()->size(), 1);
  });
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
