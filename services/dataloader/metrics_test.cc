#include "services/dataloader/metrics.h"

#include "gtest/gtest.h"

namespace recfleet::dataloader {
namespace {

TEST(LoaderMetricsTest, ExposesCountersGapsAndDepths) {
  LoaderMetrics m;
  m.RecordSent("jobs/a", 3, 100, 4000);
  m.RecordSent("jobs/a", 3, 28, 1000);
  m.RecordStep("jobs/a", 0.001, 0.25);
  m.RecordStep("jobs/a", 0.003, 0.5);
  m.SetQueueDepth("jobs/a", 3, 2);
  std::string t = m.PrometheusText();
  EXPECT_NE(t.find("recfleet_dataloader_samples_total{recfleet_job=\"jobs/a\",rank=\"3\"} 128\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_bytes_total{recfleet_job=\"jobs/a\",rank=\"3\"} 5000\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_straggler_gap{recfleet_job=\"jobs/a\",dealing=\"naive\"} 0.5\n"),
            std::string::npos);
  EXPECT_NE(t.find("recfleet_dataloader_straggler_gap{recfleet_job=\"jobs/a\",dealing=\"policy\"} 0.003\n"),
            std::string::npos);
  // A real histogram per job and dealing: _sum/_count over the steps, and
  // no counter that borrows histogram suffixes.
  EXPECT_NE(t.find("# TYPE recfleet_dataloader_step_straggler_gap_ratio histogram\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_sum{recfleet_job=\"jobs/a\",dealing=\"naive\"} 0.75\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_count{recfleet_job=\"jobs/a\",dealing=\"policy\"} 2\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_bucket{recfleet_job=\"jobs/a\",dealing=\"naive\",le=\"0.256\"} 1\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_bucket{recfleet_job=\"jobs/a\",dealing=\"naive\",le=\"0.512\"} 2\n"),
            std::string::npos) << t;
  EXPECT_EQ(t.find("# TYPE recfleet_dataloader_straggler_gap_sum"), std::string::npos) << t;
  EXPECT_EQ(t.find("# TYPE recfleet_dataloader_straggler_gap_count"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_queue_depth{recfleet_job=\"jobs/a\",rank=\"3\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE recfleet_dataloader_samples_total counter"), std::string::npos);
}

}  // namespace
}  // namespace recfleet::dataloader
