#include "planner/cost_model.h"

#include "gtest/gtest.h"
#include "planner/topology.h"

namespace recfleet::planner {
namespace {

// 4 zones x 2 nodes x 8 GPUs; round numbers so answers can be worked by hand.
Topology Fleet() {
  Topology t;
  t.name = "test";
  t.num_nodes = 8;
  t.gpus_per_node = 8;
  t.nodes_per_zone = 2;
  t.hbm_bytes_per_gpu = 80e9;
  t.peak_flops_per_gpu = 1e15;
  t.hbm_bandwidth_bytes_per_s = 3e12;
  t.links[kNvlink] = {400e9, 2e-6};
  t.links[kZone] = {50e9, 10e-6};
  t.links[kCrossZone] = {10e9, 20e-6};
  return t;
}

TEST(TopologyTest, GroupFactorsFollowTheDomains) {
  const Topology t = Fleet();
  ASSERT_TRUE(ValidateTopology(t).ok());
  GroupShape g = MakeGroup(t, 16, 1);  // Two nodes of one zone.
  EXPECT_EQ(g.factors, (std::array<int, 3>{8, 2, 1}));
  EXPECT_EQ(g.HighestLevel(), kZone);
  g = MakeGroup(t, 4, 16);  // One rank per zone.
  EXPECT_EQ(g.factors, (std::array<int, 3>{1, 1, 4}));
  g = MakeGroup(t, 8, 8);  // Same GPU index on every node.
  EXPECT_EQ(g.factors, (std::array<int, 3>{1, 2, 4}));
  g = MakeGroup(t, 4, 2);  // Every other GPU of one node.
  EXPECT_EQ(g.factors, (std::array<int, 3>{4, 1, 1}));
  EXPECT_EQ(MakeGroup(t, 1, 1).HighestLevel(), -1);
  EXPECT_EQ(LocateRank(t, 35).zone, 2);
  EXPECT_EQ(LocateRank(t, 35).node, 4);
  EXPECT_EQ(LocateRank(t, 35).gpu, 3);
}

TEST(TopologyTest, ValidationNamesTheField) {
  Topology t = Fleet();
  t.nodes_per_zone = 3;
  absl::Status s = ValidateTopology(t);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nodes_per_zone"), std::string::npos) << s;
  t = Fleet();
  t.links[kCrossZone].bandwidth_bytes_per_s = 0;
  s = ValidateTopology(t);
  EXPECT_NE(s.message().find("cross_zone"), std::string::npos) << s;
}

TEST(CostModelTest, AllGatherInsideOneNode) {
  const Topology t = Fleet();
  // 8 GPUs, 1 GB gathered: 7 steps of 2 us and 7/8 GB at 400 GB/s.
  CommCost c = CollectiveCost(t, MakeGroup(t, 8, 1), Collective::kAllGather, 1e9);
  EXPECT_DOUBLE_EQ(c.bytes_per_level[kNvlink], 0.875e9);
  EXPECT_NEAR(c.seconds, 7 * 2e-6 + 0.875e9 / 400e9, 1e-12);
  EXPECT_EQ(c.seconds_per_level[kZone], 0);
}

TEST(CostModelTest, HierarchicalAllGatherPutsLeastOnSlowLinks) {
  const Topology t = Fleet();
  // 16 GPUs over 2 nodes: NVLink carries 7/8 of M, the zone 1/16 of M.
  const double m = 1.6e9;
  CommCost c = CollectiveCost(t, MakeGroup(t, 16, 1), Collective::kAllGather, m);
  EXPECT_DOUBLE_EQ(c.bytes_per_level[kNvlink], m * 7 / 8);
  EXPECT_DOUBLE_EQ(c.bytes_per_level[kZone], m / 16);
  EXPECT_NEAR(c.seconds, 7 * 2e-6 + m * 7 / 8 / 400e9 + 1 * 10e-6 + m / 16 / 50e9, 1e-12);
  // Reduce-scatter mirrors it; all-reduce is both.
  CommCost rs = CollectiveCost(t, MakeGroup(t, 16, 1), Collective::kReduceScatter, m);
  EXPECT_DOUBLE_EQ(rs.seconds, c.seconds);
  CommCost ar = CollectiveCost(t, MakeGroup(t, 16, 1), Collective::kAllReduce, m);
  EXPECT_NEAR(ar.seconds, 2 * c.seconds, 1e-12);
}

TEST(CostModelTest, AllToAllChargesEveryPeerAtItsLevel) {
  const Topology t = Fleet();
  // 16 ranks: 7 peers on NVLink, 8 across the zone; 1/16 of M to each.
  const double m = 1.6e9;
  CommCost c = CollectiveCost(t, MakeGroup(t, 16, 1), Collective::kAllToAll, m);
  EXPECT_DOUBLE_EQ(c.bytes_per_level[kNvlink], m * 7 / 16);
  EXPECT_DOUBLE_EQ(c.bytes_per_level[kZone], m * 8 / 16);
  EXPECT_NEAR(c.seconds, 7 * 2e-6 + m * 7 / 16 / 400e9 + 8 * 10e-6 + m * 8 / 16 / 50e9, 1e-12);
}

TEST(CostModelTest, TrivialGroupsAndComputeTime) {
  const Topology t = Fleet();
  EXPECT_EQ(CollectiveCost(t, MakeGroup(t, 1, 1), Collective::kAllReduce, 1e9).seconds, 0);
  EXPECT_EQ(CollectiveCost(t, MakeGroup(t, 8, 1), Collective::kAllGather, 0).seconds, 0);
  EXPECT_DOUBLE_EQ(ComputeSeconds(5e14, 1e15, 0.5), 1.0);
}

TEST(CostModelTest, MoreBandwidthNeverSlower) {
  Topology slow = Fleet();
  for (int level = 0; level < kNumLevels; ++level) {
    Topology fast = slow;
    fast.links[level].bandwidth_bytes_per_s *= 1.5;
    fast.links[level].latency_s /= 2;
    for (auto c : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce,
                   Collective::kAllToAll}) {
      for (int size : {2, 8, 16, 64}) {
        for (int stride : {1, 8}) {
          if (size * stride > slow.WorldSize()) continue;
          EXPECT_LE(CollectiveCost(fast, MakeGroup(fast, size, stride), c, 3e8).seconds,
                    CollectiveCost(slow, MakeGroup(slow, size, stride), c, 3e8).seconds);
        }
      }
    }
  }
}

}  // namespace
}  // namespace recfleet::planner
