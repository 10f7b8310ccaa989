#include "worker/dist/sharded_embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing.h"
#include "worker/dist/sharded_embedding_testing.h"

namespace recfleet {
namespace dist {
namespace {

TEST(EmbeddingShardingPlanTest, RowRangesCoverEveryRowOnce) {
  auto plan = EmbeddingShardingPlan::Create(
      {{"a", 10, 2}, {"b", 2, 3}, {"c", 7, 1}},
      {{TableSharding::kRowWise}, {TableSharding::kRowWise}, {TableSharding::kTableWise, 2}}, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->RowRange(0, 0), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(plan->RowRange(0, 2), std::make_pair(int64_t{8}, int64_t{10}));
  // 2 rows over 3 ranks: rank 2 holds none and is not listed as holding b.
  EXPECT_EQ(plan->RowRange(1, 2).first, plan->RowRange(1, 2).second);
  EXPECT_EQ(plan->TablesOn(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan->TablesOn(2), (std::vector<int>{0, 2}));
  for (int t = 0; t < plan->num_tables(); ++t) {
    int64_t next = 0;
    for (int r = 0; r < 3; ++r) {
      const auto range = plan->RowRange(t, r);
      if (range.first == range.second) continue;
      EXPECT_EQ(range.first, next);
      next = range.second;
    }
    EXPECT_EQ(next, plan->table(t).rows);
  }
}

TEST(EmbeddingShardingPlanTest, ListedRanksHoldRowBlocksAndColumnSlicesInOrder) {
  auto plan = EmbeddingShardingPlan::Create({{"rows", 10, 2}, {"cols", 3, 8}},
                                            {{TableSharding::kRowWise, 0, {2, 0}},
                                             {TableSharding::kColumnWise, 0, {3, 1}}},
                                            4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->RowRange(0, 2), std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_EQ(plan->RowRange(0, 0), std::make_pair(int64_t{5}, int64_t{10}));
  EXPECT_EQ(plan->RowRange(0, 1).first, plan->RowRange(0, 1).second);
  EXPECT_EQ(plan->ColumnRange(0, 0), std::make_pair(int64_t{0}, int64_t{2}));
  // Column slices: every row, slice 0 on rank 3, slice 1 on rank 1.
  EXPECT_EQ(plan->RowRange(1, 3), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(plan->ColumnRange(1, 3), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(plan->ColumnRange(1, 1), std::make_pair(int64_t{4}, int64_t{8}));
  EXPECT_EQ(plan->Columns(1, 0), 0);
  EXPECT_EQ(plan->TablesOn(0), (std::vector<int>{0}));
  EXPECT_EQ(plan->TablesOn(1), (std::vector<int>{1}));
  EXPECT_TRUE(plan->TablesOn(2) == std::vector<int>{0});
  EXPECT_EQ(plan->TablesOn(3), (std::vector<int>{1}));
}

TEST(PlacementsFromPlanTest, KeepsThePlansChoiceForEveryTable) {
  const std::vector<EmbeddingTableConfig> tables = {{"a", 10, 8}, {"b", 10, 8}, {"c", 10, 8}, {"d", 10, 8}};
  auto p = PlacementsFromPlan(
      tables, {{"a", "TW", 1, {2}}, {"b", "CW", 2, {3, 0}}, {"c", "TWRW", 2, {0, 1}}, {"d", "RW", 4, {}}}, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0].sharding, TableSharding::kTableWise);
  EXPECT_EQ((*p)[0].owner, 2);
  EXPECT_EQ((*p)[1].sharding, TableSharding::kColumnWise);
  EXPECT_EQ((*p)[1].ranks, (std::vector<int>{3, 0}));
  EXPECT_EQ((*p)[2].sharding, TableSharding::kRowWise);
  EXPECT_EQ((*p)[2].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ((*p)[3].sharding, TableSharding::kRowWise);
  EXPECT_TRUE((*p)[3].ranks.empty());
  // Entries that do not describe these tables on this group are refused by name.
  auto wrong_name = PlacementsFromPlan(tables, {{"a", "TW", 1, {0}}, {"x", "TW", 1, {0}}, {"c", "TW", 1, {0}},
                                                {"d", "TW", 1, {0}}}, 4);
  EXPECT_NE(wrong_name.status().message().find("'b'"), absl::string_view::npos) << wrong_name.status();
  auto outside = PlacementsFromPlan(tables, {{"a", "TW", 1, {4}}, {"b", "TW", 1, {0}}, {"c", "TW", 1, {0}},
                                             {"d", "TW", 1, {0}}}, 4);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = PlacementsFromPlan(tables, {{"a", "DP", 1, {0}}, {"b", "TW", 1, {0}}, {"c", "TW", 1, {0}},
                                             {"d", "TW", 1, {0}}}, 4);
  EXPECT_NE(unknown.status().message().find("unknown sharding 'DP'"), absl::string_view::npos);
  auto miscount = PlacementsFromPlan(tables, {{"a", "CW", 4, {0, 1}}, {"b", "TW", 1, {0}}, {"c", "TW", 1, {0}},
                                              {"d", "TW", 1, {0}}}, 4);
  EXPECT_EQ(miscount.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingShardingPlanTest, RejectsBadPlans) {
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 0, 2}}, {{}}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {{TableSharding::kTableWise, 2}}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {{TableSharding::kRowWise, 0, {0, 0}}}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {{TableSharding::kRowWise, 0, {2}}}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 3}}, {{TableSharding::kColumnWise, 0, {0, 1}}}, 2).ok());
}

comm::CommFactory GlooConnector() {
  return [](comm::KvStore& store, int rank, int size) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    auto transport = comm::GlooTransport::Create("127.0.0.1");
    if (!transport.ok()) return transport.status();
    comm::CommOptions options;
    options.timeout = absl::Seconds(20);
    return comm::ConnectGloo(store, rank, size, *transport, options);
  };
}

TEST(ShardedEmbeddingCollectionTest, OneRankMatchesWholeTables) {
  comm::HostTestMemory m;
  CheckAgainstWholeTables(1, m, GlooConnector());
}
TEST(ShardedEmbeddingCollectionTest, TwoRanksMatchWholeTables) {
  comm::HostTestMemory m;
  CheckAgainstWholeTables(2, m, GlooConnector());
}
TEST(ShardedEmbeddingCollectionTest, ThreeRanksMatchWholeTables) {
  comm::HostTestMemory m;
  CheckAgainstWholeTables(3, m, GlooConnector());
}

TEST(BalancedTablePlacementsTest, SplitsLargeTablesAndSpreadsTheRest) {
  const std::vector<EmbeddingTableConfig> tables = {
      {"big", 1000, 8, Pooling::kSum}, {"a", 100, 8, Pooling::kSum}, {"b", 300, 8, Pooling::kSum},
      {"c", 200, 8, Pooling::kSum}};
  const std::vector<TablePlacement> p = BalancedTablePlacements(tables, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].sharding, TableSharding::kRowWise);  // 8000 of 12800 > half.
  // The rest largest first onto the lighter rank: b -> 0, c -> 1, a -> 1.
  EXPECT_EQ(p[2].sharding, TableSharding::kTableWise);
  EXPECT_EQ(p[2].owner, 0);
  EXPECT_EQ(p[3].owner, 1);
  EXPECT_EQ(p[1].owner, 1);
  for (const TablePlacement& one : BalancedTablePlacements(tables, 1)) EXPECT_EQ(one.owner, 0);
  EXPECT_TRUE(EmbeddingShardingPlan::Create(tables, p, 2).ok());
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
