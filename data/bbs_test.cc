#include "data/bbs.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "data/balance.h"
#include "data/cost_model.h"
#include "data/synth.h"
#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

std::vector<double> LogNormalCosts(size_t n, const CostModel& m, uint64_t seed) {
  auto d = LengthDistribution::Parse("lognormal:mean=1000,sigma=1.2,min=10,max=50000");
  EXPECT_TRUE(d.ok());
  std::mt19937_64 rng(seed);
  std::vector<double> c(n);
  for (double& x : c) x = m.SampleCost(d->Sample(rng));
  return c;
}

void ExpectExactlyOnce(const Deal& deal, size_t n, size_t ranks) {
  std::vector<int> seen(n, 0);
  ASSERT_EQ(deal.ranks.size(), ranks);
  size_t min_size = n, max_size = 0;
  for (const auto& rank : deal.ranks) {
    size_t size = 0;
    for (const auto& bb : rank) {
      for (uint32_t i : bb) {
        ASSERT_LT(i, n);
        ++seen[i];
      }
      size += bb.size();
    }
    min_size = std::min(min_size, size);
    max_size = std::max(max_size, size);
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
  EXPECT_LE(max_size - min_size, 128u);
}

TEST(BbsTest, EveryPolicyDealsEverySampleOnce) {
  DealOptions o;
  o.ranks = 4;
  o.base_batch = 16;
  o.base_batches_per_rank = 3;
  for (size_t n : {size_t{192}, size_t{191}, size_t{50}, size_t{1}, size_t{0}}) {
    auto costs = LogNormalCosts(n, CostModel{}, n);
    for (Policy p : {Policy::kNaive, Policy::kSortInterleave, Policy::kRecfleet}) {
      for (bool aware : {true, false}) {
        o.length_aware_base_batches = aware;
        Deal d = DealWindow(p, costs, o);
        ExpectExactlyOnce(d, n, 4);
        if (n == 192) {
          for (const auto& rank : d.ranks) {
            ASSERT_EQ(rank.size(), 3u);
            for (const auto& bb : rank) EXPECT_EQ(bb.size(), 16u);
          }
        }
      }
    }
  }
}

TEST(BbsTest, RecfleetBeatsSortInterleaveOnHeavyTails) {
  DealOptions o;  // 8 ranks x 8 base batches of 128.
  for (const char* spec : {"linear", "quadratic"}) {
    CostModel m = *CostModel::Parse(spec);
    double naive = 0, bbs = 0, ours = 0;
    const int windows = 6;
    for (int w = 0; w < windows; ++w) {
      auto costs = LogNormalCosts(o.WindowSize(), m, 100 + w);
      naive += DealWindow(Policy::kNaive, costs, o).Gap() / windows;
      bbs += DealWindow(Policy::kSortInterleave, costs, o).Gap() / windows;
      Deal d = DealWindow(Policy::kRecfleet, costs, o);
      ours += d.Gap() / windows;
      EXPECT_GE(d.Gap() + 1e-12, GapLowerBound(costs, o.ranks));
    }
    EXPECT_LT(bbs, naive) << spec;
    EXPECT_LT(ours, bbs) << spec;
    if (std::string(spec) == "linear") {
      EXPECT_LT(ours, 0.001);
    }
  }
}

TEST(BbsTest, LengthAwareBaseBatchesAreEvenWithinARank) {
  DealOptions o;
  auto costs = LogNormalCosts(o.WindowSize(), CostModel{}, 7);
  Deal d = DealWindow(Policy::kRecfleet, costs, o);
  for (const auto& rank : d.ranks) {
    std::vector<double> bb_cost;
    for (const auto& bb : rank) {
      double c = 0;
      for (uint32_t i : bb) c += costs[i];
      bb_cost.push_back(c);
    }
    double mean = std::accumulate(bb_cost.begin(), bb_cost.end(), 0.0) / bb_cost.size();
    EXPECT_LT(*std::max_element(bb_cost.begin(), bb_cost.end()) / mean - 1, 0.01);
  }
}

TEST(BbsTest, MicroBatchOrderingEvensPairs) {
  // Consecutive base batches with costs 8,7,...,1 on one rank: micro-batches
  // of two must come out as pairs summing to 9.
  DealOptions o;
  o.ranks = 1;
  o.base_batch = 1;
  o.base_batches_per_rank = 8;
  o.length_aware_base_batches = false;
  o.micro_batch_base_batches = 2;
  std::vector<double> costs = {8, 7, 6, 5, 4, 3, 2, 1};
  Deal d = DealWindow(Policy::kRecfleet, costs, o);
  ASSERT_EQ(d.ranks[0].size(), 8u);
  for (size_t j = 0; j < 8; j += 2) {
    EXPECT_EQ(costs[d.ranks[0][j][0]] + costs[d.ranks[0][j + 1][0]], 9) << "micro-batch " << j / 2;
  }
}

TEST(BbsTest, PartitionHonoursSizes) {
  std::vector<double> costs = {100, 1, 1, 1, 1, 1, 1, 50};
  std::vector<uint32_t> items(8);
  std::iota(items.begin(), items.end(), 0);
  auto groups = BalancedPartition(costs, items, {2, 6}, 100);
  EXPECT_EQ(groups[0].size(), 2u);
  EXPECT_EQ(groups[1].size(), 6u);
}

TEST(BbsTest, DealIsDeterministic) {
  DealOptions o;
  auto costs = LogNormalCosts(o.WindowSize(), *CostModel::Parse("quadratic"), 9);
  Deal a = DealWindow(Policy::kRecfleet, costs, o);
  Deal b = DealWindow(Policy::kRecfleet, costs, o);
  EXPECT_EQ(a.ranks, b.ranks);
}

TEST(CostModelTest, ParsesTermsAndLists) {
  EXPECT_EQ(CostModel::Parse("quadratic")->SampleCost(10), 100);
  auto m = CostModel::Parse("linear=2,windowed=1,window=4,block=1,block_size=3,per_sample=5");
  ASSERT_TRUE(m.ok());
  // 5 + 2*10 + 10*min(10,4) + 10*min(10,3)
  EXPECT_EQ(m->SampleCost(10), 5 + 20 + 40 + 30);
  EXPECT_EQ(CostModel::Parse(m->ToString())->SampleCost(7), m->SampleCost(7));
  EXPECT_FALSE(CostModel::Parse("cubic=1").ok());
  EXPECT_FALSE(CostModel::Parse("linear=x").ok());
  EXPECT_FALSE(CostModel::Parse("linear=0").ok());
  // Weights must be finite and >= 0 (a NaN compares false with 0).
  EXPECT_FALSE(CostModel::Parse("linear=-1").ok());
  EXPECT_FALSE(CostModel::Parse("linear=1,quadratic=nan").ok());
  EXPECT_FALSE(CostModel::Parse("linear=inf").ok());
}

TEST(BalanceTest, ReportHasEveryPolicyAndOrdersThem) {
  auto d = LengthDistribution::Parse("lognormal:mean=300,sigma=1,min=10,max=5000");
  std::mt19937_64 rng(3);
  std::vector<int64_t> lengths(20000);
  for (auto& l : lengths) l = d->Sample(rng);
  DealOptions o;
  o.ranks = 4;
  o.base_batches_per_rank = 4;
  auto rows = ComputeBalance(lengths, CostModel{}, o, 1);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].gap.steps, 20000u / 2048);
  EXPECT_GT(rows[0].gap.mean, rows[1].gap.mean);
  EXPECT_GT(rows[1].gap.mean, rows[2].gap.mean);
  EXPECT_GE(rows[2].gap.mean + 1e-12, rows[4].gap.mean);
  EXPECT_LE(rows[2].gap.p50, rows[2].gap.p99);
  EXPECT_LE(rows[2].gap.p99, rows[2].gap.max);
  EXPECT_NE(FormatBalance(rows).find("sort-interleave"), std::string::npos);
}

TEST(BalanceTest, SummarizePercentiles) {
  std::vector<double> g(100);
  for (int i = 0; i < 100; ++i) g[i] = i;
  GapStats s = Summarize(g);
  EXPECT_EQ(s.p50, 49);
  EXPECT_EQ(s.p99, 98);
  EXPECT_EQ(s.max, 99);
  EXPECT_DOUBLE_EQ(s.mean, 49.5);
}

}  // namespace
}  // namespace recfleet::data
