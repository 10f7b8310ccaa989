#include "planner/sharding.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace recfleet::planner {
namespace {

Topology Node8() {
  Topology t;
  t.num_nodes = 2;
  t.gpus_per_node = 8;
  t.nodes_per_zone = 2;
  t.hbm_bytes_per_gpu = 80e9;
  t.peak_flops_per_gpu = 1e15;
  t.hbm_bandwidth_bytes_per_s = 1e12;
  t.links[kNvlink] = {400e9, 2e-6};
  t.links[kZone] = {50e9, 10e-6};
  return t;
}

struct Fixture {
  Model model;
  Topology topology = Node8();
  PrecisionRecipe precision;
  Efficiencies efficiency;
  PlannerOptions options;
  absl::StatusOr<ShardingResult> Shard(int group, double limit = 1e12, int divisor = 1) {
    ShardingInput in{&model, &topology, &precision, &efficiency, &options,
                     MakeGroup(topology, group, 1), /*local_batch=*/100, divisor, limit};
    return ShardTables(in);
  }
};

Table MakeTable(const std::string& name, int64_t rows, int dim) {
  Table t;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  return t;
}

TEST(ShardingTest, EqualTablesGoOnePerRank) {
  Fixture f;
  for (int i = 0; i < 4; ++i) f.model.tables.push_back(MakeTable("t" + std::to_string(i), 1000, 64));
  auto r = f.Shard(4);
  ASSERT_TRUE(r.ok()) << r.status();
  std::set<int> ranks;
  for (const TableSharding& ts : r->tables) {
    EXPECT_EQ(ts.type, ShardingType::kTableWise);
    ASSERT_EQ(ts.ranks.size(), 1u);
    ranks.insert(ts.ranks[0]);
  }
  EXPECT_EQ(ranks.size(), 4u);
  // 1000 rows x 64 x 4 bytes + 1000 x 4 bytes of rowwise Adagrad.
  EXPECT_DOUBLE_EQ(r->tables[0].shard_bytes, 1000.0 * 64 * 4 + 1000.0 * 4);
  EXPECT_DOUBLE_EQ(r->compute_imbalance, 1.0);
  // Lookups: 4 ranks x 100 samples x 1 id; 4 HBM passes of 64 x 4 bytes at 0.5 x 1 TB/s.
  EXPECT_NEAR(r->tables[0].shard_compute_s, 4 * 400.0 * 64 * 4 / 0.5e12, 1e-15);
  // Pooled output: 400 samples x 64 x 2 bytes.
  EXPECT_DOUBLE_EQ(r->tables[0].shard_out_bytes, 400.0 * 64 * 2);
}

TEST(ShardingTest, OneBigTableIsSplitColumnWiseFirst) {
  Fixture f;
  f.model.tables.push_back(MakeTable("big", 4000, 256));
  for (int i = 0; i < 3; ++i) f.model.tables.push_back(MakeTable("s" + std::to_string(i), 1000, 64));
  auto r = f.Shard(4);
  ASSERT_TRUE(r.ok()) << r.status();
  // Fair share is (4000*256*4 + 3*1000*64*4 + row state) / 4, below the big
  // table: CW x2 (128 columns) still exceeds it, CW x4 fits.
  const TableSharding& big = r->tables[0];
  EXPECT_EQ(big.type, ShardingType::kColumnWise);
  EXPECT_EQ(big.num_shards, 4);
  EXPECT_EQ(big.cols_per_shard, 64);
  std::set<int> distinct(big.ranks.begin(), big.ranks.end());
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_NE(big.reason.find("CWx2"), std::string::npos) << big.reason;
}

TEST(ShardingTest, NarrowTableFallsBackToRowWise) {
  Fixture f;
  f.options.min_column_shard_dim = 64;
  f.model.tables.push_back(MakeTable("big", 100000, 64));
  f.model.tables.push_back(MakeTable("small", 10, 64));
  auto r = f.Shard(16);
  ASSERT_TRUE(r.ok()) << r.status();
  // 16 ranks over 2 nodes: TWRW (8 ranks of one node) is still above the
  // fair share, RW over all 16 is not.
  EXPECT_EQ(r->tables[0].type, ShardingType::kRowWise);
  EXPECT_EQ(r->tables[0].rows_per_shard, 6250);
  // A row shard of a pooled table still returns a full-width partial sum.
  EXPECT_DOUBLE_EQ(r->tables[0].shard_out_bytes, 1600.0 * 64 * 2);
}

TEST(ShardingTest, HardLimitErrorNamesTheTable) {
  Fixture f;
  f.model.tables.push_back(MakeTable("huge_ids", 1000000, 128));
  auto r = f.Shard(2, /*limit=*/100e6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("huge_ids"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("over by"), std::string::npos) << r.status();
}

TEST(ShardingTest, NeverPlacesOverTheLimitAndBalances) {
  Fixture f;
  for (int i = 0; i < 40; ++i) {
    f.model.tables.push_back(MakeTable("t" + std::to_string(i), 1000 + 997 * (i % 7), 32 << (i % 3)));
  }
  auto r = f.Shard(8);
  ASSERT_TRUE(r.ok());
  const double most = *std::max_element(r->rank_bytes.begin(), r->rank_bytes.end());
  auto tight = f.Shard(8, most * 1.1);
  ASSERT_TRUE(tight.ok()) << tight.status();
  for (double b : tight->rank_bytes) EXPECT_LE(b, most * 1.1);
  EXPECT_LT(r->compute_imbalance, 1.3);
}

TEST(ShardingTest, StorageDivisorSplitsStoredBytes) {
  Fixture f;
  f.model.tables.push_back(MakeTable("t", 1000, 64));
  auto one = f.Shard(2, 1e12, 1);
  auto four = f.Shard(2, 1e12, 4);
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_DOUBLE_EQ(four->tables[0].shard_bytes * 4, one->tables[0].shard_bytes);
}

}  // namespace
}  // namespace recfleet::planner
