#include "worker/batch_plan.h"

#include <set>

#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

TEST(BatchPlanTest, EveryEpochDealsEachSampleAtMostOnceAcrossRanks) {
  auto plan = BatchPlan::Create(1000, 3, 32, 7);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->steps_per_epoch(), 10);  // 1000 / 96.
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t s = 1; s <= plan->steps_per_epoch(); ++s) {
      for (int r = 0; r < 3; ++r) {
        for (int64_t row : plan->Rows(epoch * plan->steps_per_epoch() + s, r)) {
          ASSERT_GE(row, 0);
          ASSERT_LT(row, 1000);
          ASSERT_TRUE(seen.insert(row).second) << "row " << row << " twice in epoch " << epoch;
        }
      }
    }
    EXPECT_EQ(seen.size(), 960u);
  }
}

TEST(BatchPlanTest, DeterministicAndEpochsDiffer) {
  auto a = BatchPlan::Create(500, 2, 10, 1);
  auto b = BatchPlan::Create(500, 2, 10, 1);
  auto c = BatchPlan::Create(500, 2, 10, 2);
  EXPECT_EQ(a->Rows(7, 1), b->Rows(7, 1));
  EXPECT_NE(a->Rows(7, 1), c->Rows(7, 1));
  EXPECT_NE(a->Rows(1, 0), a->Rows(1 + a->steps_per_epoch(), 0));
}

TEST(BatchPlanTest, RejectsADatasetSmallerThanOneStep) {
  EXPECT_EQ(BatchPlan::Create(10, 2, 8, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::worker
