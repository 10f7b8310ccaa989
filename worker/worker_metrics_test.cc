#include "worker/worker_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

TEST(WorkerMetricsTest, TaskInfoUsesRecfleetJobAndLeavesWithTheTask) {
  WorkerMetrics m;
  m.StartTask("jobs/a", 1, 4);
  std::string t = m.registry().Render();
  // `job` is the scrape target's label in Prometheus; ours is recfleet_job.
  EXPECT_NE(t.find("recfleet_worker_task_info{rank=\"1\",recfleet_job=\"jobs/a\",world_size=\"4\"} 1\n"),
            std::string::npos)
      << t;
  m.StartTask("jobs/b", 0, 2);
  t = m.registry().Render();
  // The previous task's series is gone, not left at 0: a join on the info
  // series must find exactly one task per instance.
  EXPECT_EQ(t.find("jobs/a"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_worker_task_info{rank=\"0\",recfleet_job=\"jobs/b\",world_size=\"2\"} 1\n"),
            std::string::npos)
      << t;
  m.EndTask();
  t = m.registry().Render();
  EXPECT_EQ(t.find("recfleet_worker_task_info{"), std::string::npos) << t;
}

TEST(WorkerMetricsTest, UsefulFlopRateIsInBaseUnits) {
  WorkerMetrics m;
  m.StartTask("jobs/a", 0, 1);
  StepTimes times;
  times.step_seconds = 0.01;
  m.RecordStep(1, 128, 5e12, 0.7, times);
  const std::string t = m.registry().Render();
  EXPECT_NE(t.find("# TYPE recfleet_worker_useful_flops_per_second gauge\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("tflops"), std::string::npos) << t;
  // 5e12 FLOPs in a window of well under a second: far above 1e12 FLOP/s,
  // which a TFLOP/s-scaled gauge could only reach at 1e24 FLOP/s.
  EXPECT_GT(m.useful_flops_per_second(), 1e12);
}

}  // namespace
}  // namespace recfleet::worker
