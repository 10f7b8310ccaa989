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

std::vector<int> Ranks(const comm::ProcessGroupSpec& s) { return s.ranks; }

TEST(TrainingGroupSpecsTest, TakesThePlanGroupsAndDerivesTheReplicas) {
  // 8 ranks: FSDP groups of 4, tables over strided pairs {0,4}, {1,5}, ...
  std::vector<NamedGroup> plan = {{"world", {0, 1, 2, 3, 4, 5, 6, 7}}, {"fsdp/0", {0, 1, 2, 3}},
                                  {"fsdp/1", {4, 5, 6, 7}},           {"replica/0", {0, 4}},
                                  {"tables/0", {0, 4}},               {"tables/1", {1, 5}},
                                  {"tables/2", {2, 6}},               {"tables/3", {3, 7}}};
  auto specs = TrainingGroupSpecs(5, 8, plan, {});
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  EXPECT_EQ((*specs)[0].name, "fsdp");
  EXPECT_EQ((*specs)[0].index, 1);
  EXPECT_EQ(Ranks((*specs)[0]), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ((*specs)[1].name, "replica");
  EXPECT_EQ(Ranks((*specs)[1]), (std::vector<int>{1, 5}));
  EXPECT_EQ((*specs)[2].name, "tables");
  EXPECT_EQ((*specs)[2].index, 1);
  EXPECT_EQ(Ranks((*specs)[2]), (std::vector<int>{1, 5}));
  EXPECT_EQ((*specs)[3].name, "table_replica");
  EXPECT_EQ((*specs)[3].index, 1);
  EXPECT_EQ(Ranks((*specs)[3]), (std::vector<int>{4, 5, 6, 7}));
}

TEST(TrainingGroupSpecsTest, FallsBackToHintsAndToTheFsdpGroupForTables) {
  auto specs = TrainingGroupSpecs(3, 4, {{"world", {0, 1, 2, 3}}}, {2, 0, 0});
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(Ranks((*specs)[0]), (std::vector<int>{2, 3}));
  EXPECT_EQ(Ranks((*specs)[1]), (std::vector<int>{1, 3}));
  EXPECT_EQ(Ranks((*specs)[2]), (std::vector<int>{2, 3}));
  EXPECT_EQ(Ranks((*specs)[3]), (std::vector<int>{1, 3}));
  specs = TrainingGroupSpecs(0, 2, {{"fsdp/0", {0, 1}}}, {});
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(Ranks((*specs)[2]), (std::vector<int>{0, 1}));
  EXPECT_EQ(Ranks((*specs)[3]), (std::vector<int>{0}));
}

TEST(TrainingGroupSpecsTest, ExpertGroupsGiveTheExpertAndExpertReplicaSpecs) {
  const std::vector<NamedGroup> plan = {{"fsdp/0", {0, 1, 2, 3}}, {"expert/moe/0", {0, 1}}, {"expert/moe/1", {2, 3}}};
  auto specs = TrainingGroupSpecs(3, 4, plan, {});
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 6u);
  EXPECT_EQ((*specs)[4].name, "expert");
  EXPECT_EQ((*specs)[4].index, 1);
  EXPECT_EQ(Ranks((*specs)[4]), (std::vector<int>{2, 3}));
  // Rank 3 owns the experts rank 1 owns in the other group.
  EXPECT_EQ((*specs)[5].name, "expert_replica");
  EXPECT_EQ((*specs)[5].index, 1);
  EXPECT_EQ(Ranks((*specs)[5]), (std::vector<int>{1, 3}));
  EXPECT_EQ(TrainingGroupSpecs(3, 4, {{"fsdp/0", {0, 1, 2, 3}}}, {})->size(), 4u);
  // Two expert modules, or expert groups that miss ranks, are refused.
  EXPECT_FALSE(TrainingGroupSpecs(0, 2, {{"fsdp/0", {0, 1}}, {"expert/a/0", {0, 1}}, {"expert/b/0", {0, 1}}}, {}).ok());
  EXPECT_FALSE(TrainingGroupSpecs(0, 4, {{"fsdp/0", {0, 1, 2, 3}}, {"expert/moe/0", {0, 1}}}, {}).ok());
}

TEST(TrainingGroupSpecsTest, V3ShardGroupsSplitOnePositionsShards) {
  // Tables over {0, 2} and {1, 3}; ranks 0 and 1 (and 2 and 3) hold the
  // same position, so they may split its shards.
  const std::vector<NamedGroup> plan = {{"fsdp/0", {0, 1, 2, 3}},
                                        {"tables/0", {0, 2}},
                                        {"tables/1", {1, 3}},
                                        {"table_shards/0", {0, 1}},
                                        {"table_shards/1", {2, 3}}};
  auto specs = TrainingGroupSpecs(2, 4, plan, {});
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 5u);
  EXPECT_EQ((*specs)[4].name, "table_shards");
  EXPECT_EQ(Ranks((*specs)[4]), (std::vector<int>{2, 3}));
  // Ranks of different positions cannot split shards.
  auto wrong = TrainingGroupSpecs(
      0, 4, {{"fsdp/0", {0, 1, 2, 3}}, {"tables/0", {0, 1}}, {"tables/1", {2, 3}}, {"table_shards/0", {0, 1}},
             {"table_shards/1", {2, 3}}},
      {});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainingGroupSpecsTest, RejectsBrokenPlans) {
  EXPECT_FALSE(TrainingGroupSpecs(0, 4, {{"fsdp/0", {0, 1}}, {"fsdp/1", {2}}}, {}).ok());          // Sizes.
  EXPECT_FALSE(TrainingGroupSpecs(0, 4, {{"fsdp/0", {0, 1}}, {"fsdp/1", {1, 2}}}, {}).ok());       // Overlap.
  EXPECT_FALSE(TrainingGroupSpecs(0, 4, {{"fsdp/0", {0, 1}}}, {}).ok());                           // Coverage.
  EXPECT_FALSE(TrainingGroupSpecs(0, 2, {{"fsdp/x", {0, 1}}}, {}).ok());                           // Name.
  EXPECT_FALSE(TrainingGroupSpecs(0, 4, {}, {3, 0, 0}).ok());                                      // Hints.
  EXPECT_FALSE(TrainingGroupSpecs(4, 4, {}, {}).ok());                                             // Rank.
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
