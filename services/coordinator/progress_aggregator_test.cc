#include "services/coordinator/progress_aggregator.h"

#include "gtest/gtest.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::JobProgress;
using ::recfleet::v1::StepStats;
using Steps = google::protobuf::RepeatedPtrField<StepStats>;

Steps OneStep(int64_t step, int64_t samples, double seconds, double loss) {
  Steps out;
  StepStats* s = out.Add();
  s->set_step(step);
  s->set_samples(samples);
  s->set_step_seconds(seconds);
  s->set_data_wait_seconds(seconds / 4);
  s->set_loss(loss);
  return out;
}

TEST(ProgressAggregatorTest, JobMovesAtTheSlowestRanksPace) {
  ProgressAggregator agg;
  agg.Reset(2, 0);
  EXPECT_EQ(agg.world_size(), 2);
  for (int step = 1; step <= 3; ++step) {
    EXPECT_EQ(agg.Record(0, OneStep(step, 100, 0.1, 0.6)), 1);
    if (step < 3) {
      EXPECT_EQ(agg.Record(1, OneStep(step, 100, 0.3, 0.4)), 1);
    }
  }
  JobProgress p;
  agg.Compute(p);
  EXPECT_EQ(p.step(), 2);  // Rank 1 has reached step 2 only.
  EXPECT_EQ(p.samples(), 500);
  EXPECT_DOUBLE_EQ(p.loss(), 0.5);
  EXPECT_EQ(p.slowest_rank(), 1);
  EXPECT_NEAR(p.step_seconds(), 0.2, 1e-12);
  EXPECT_NEAR(p.straggler_gap(), 0.3 / 0.2 - 1, 1e-9);
  EXPECT_NEAR(p.data_wait_seconds(), 0.05, 1e-12);
  // Window samples over the slowest rank's window time; each rank's first
  // step (warm-up) has left the window: rank 1's window is its step 2 alone.
  EXPECT_NEAR(p.samples_per_second(), 300 / 0.3, 1e-9);
}

TEST(ProgressAggregatorTest, AnAttemptsFirstStepLeavesTheTimingOnceASecondArrives) {
  ProgressAggregator agg;
  agg.Reset(1, 0);
  agg.Record(0, OneStep(1, 10, 4.0, 1.0));  // Warm-up.
  JobProgress p;
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 4.0, 1e-12);  // The only step there is.
  agg.Record(0, OneStep(2, 10, 0.5, 1.0));
  agg.Record(0, OneStep(3, 10, 0.3, 1.0));
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 0.4, 1e-12);
  EXPECT_NEAR(p.samples_per_second(), 20 / 0.8, 1e-9);
  EXPECT_EQ(p.samples(), 30);  // Counted all the same.

  // A restart's first step is a warm-up too; a rank that has reported only
  // its warm-up stays out of the timing while another rank is past its own.
  agg.Reset(2, 3);
  agg.Record(0, OneStep(4, 10, 4.0, 1.0));
  agg.Record(0, OneStep(5, 10, 0.3, 1.0));
  agg.Record(1, OneStep(4, 10, 4.0, 1.0));
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 0.3, 1e-12);
  EXPECT_EQ(p.slowest_rank(), 0);
  EXPECT_NEAR(p.straggler_gap(), 0.0, 1e-12);
  agg.Record(1, OneStep(5, 10, 0.5, 1.0));
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 0.4, 1e-12);
  EXPECT_EQ(p.slowest_rank(), 1);

  agg.Reset(1, 3);
  agg.Record(0, OneStep(4, 10, 9.0, 1.0));
  agg.Record(0, OneStep(5, 10, 0.2, 1.0));
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 0.2, 1e-12);
}

TEST(ProgressAggregatorTest, RetriedReportsAreNotCountedTwice) {
  ProgressAggregator agg;
  agg.Reset(1, 0);
  EXPECT_EQ(agg.Record(0, OneStep(1, 64, 0.1, 1.0)), 1);
  EXPECT_EQ(agg.Record(0, OneStep(1, 64, 0.1, 1.0)), 0);
  JobProgress p;
  agg.Compute(p);
  EXPECT_EQ(p.samples(), 64);
}

TEST(ProgressAggregatorTest, ARestartResumesAtTheCheckpointAndKeepsCountedSamples) {
  ProgressAggregator agg;
  agg.Reset(1, 0);
  agg.Record(0, OneStep(7, 1000, 0.1, 1.0));
  JobProgress p;
  agg.Compute(p);
  EXPECT_EQ(p.step(), 7);
  EXPECT_EQ(p.samples(), 1000);

  agg.Reset(2, 5);  // Restart from the checkpoint at step 5 on two ranks.
  agg.Compute(p);
  EXPECT_EQ(p.step(), 7);        // No rank has reported: nothing changes.
  EXPECT_EQ(p.samples(), 1000);  // And samples never go backwards.
  agg.Record(0, OneStep(6, 10, 0.1, 1.0));
  agg.Compute(p);
  EXPECT_EQ(p.step(), 5);  // Rank 1 is still at the resume step.
  EXPECT_EQ(p.samples(), 1000);
}

TEST(ProgressAggregatorTest, OnlyTheNewestStepsShapeTheTiming) {
  ProgressAggregator agg;
  agg.Reset(1, 0);
  agg.Record(0, OneStep(1, 1, 100.0, 1.0));  // One slow warm-up step.
  for (size_t i = 0; i < ProgressAggregator::kRecentSteps; ++i) {
    agg.Record(0, OneStep(2 + i, 1, 0.5, 1.0));
  }
  JobProgress p;
  agg.Compute(p);
  EXPECT_NEAR(p.step_seconds(), 0.5, 1e-12);
}

}  // namespace
}  // namespace recfleet::coordinator
