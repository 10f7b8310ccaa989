#include "worker/rank_sync.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/calibrate.h"
#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

engine::RateProbeOptions Cpu() {
  engine::RateProbeOptions o;
  o.device = Device::kCpu;
  o.warmup = 1;
  o.repeats = 2;  // MeasureRankSync times at least 6 steps together.
  return o;
}

TEST(RankSyncTest, TimesCpuProbesAloneAndOnTwoRanks) {
  // The two smallest probes (the CLI times all of them).
  absl::StatusOr<RankSyncResult> r = MeasureRankSync(2, Cpu(), /*max_probes=*/2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ranks, 2);
  ASSERT_EQ(r->probes.size(), 2u);
  std::vector<double> ratios;
  for (const RankSyncProbe& p : r->probes) {
    EXPECT_GT(p.single_seconds, 0) << p.name;
    // Two ranks each compute the whole probe batch: their step can be no
    // shorter than about one rank's alone (the CPU time of that work).
    EXPECT_GT(p.ranks_seconds, 0.5 * p.single_seconds) << p.name;
    ratios.push_back(p.ranks_seconds / p.single_seconds);
    std::printf("%s: alone %.2f ms, 2 ranks %.2f ms\n", p.name.c_str(), 1e3 * p.single_seconds,
                1e3 * p.ranks_seconds);
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = 0.5 * (ratios[0] + ratios[1]);
  EXPECT_NEAR(r->overhead, std::max(0.0, median - 1), 1e-12);
  EXPECT_TRUE(std::isfinite(r->overhead));
}

TEST(RankSyncTest, RejectsOneRankAndCuda) {
  EXPECT_FALSE(MeasureRankSync(1, Cpu()).ok());
  engine::RateProbeOptions cuda = Cpu();
  cuda.device = Device::kCuda;
  EXPECT_FALSE(MeasureRankSync(2, cuda).ok());
}

}  // namespace
}  // namespace recfleet::worker
