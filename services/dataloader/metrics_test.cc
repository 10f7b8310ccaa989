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
  EXPECT_NE(t.find("recfleet_dataloader_samples_total{rank=\"3\",recfleet_job=\"jobs/a\"} 128\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_bytes_total{rank=\"3\",recfleet_job=\"jobs/a\"} 5000\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_straggler_gap{dealing=\"naive\",recfleet_job=\"jobs/a\"} 0.5\n"),
            std::string::npos);
  EXPECT_NE(t.find("recfleet_dataloader_straggler_gap{dealing=\"policy\",recfleet_job=\"jobs/a\"} 0.003\n"),
            std::string::npos);
  // A real histogram per job and dealing: _sum/_count over the steps, and
  // no counter that borrows histogram suffixes.
  EXPECT_NE(t.find("# TYPE recfleet_dataloader_step_straggler_gap_ratio histogram\n"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_sum{dealing=\"naive\",recfleet_job=\"jobs/a\"} 0.75\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_count{dealing=\"policy\",recfleet_job=\"jobs/a\"} 2\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_bucket{dealing=\"naive\",recfleet_job=\"jobs/a\",le=\"0.256\"} 1\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_step_straggler_gap_ratio_bucket{dealing=\"naive\",recfleet_job=\"jobs/a\",le=\"0.512\"} 2\n"),
            std::string::npos) << t;
  EXPECT_EQ(t.find("# TYPE recfleet_dataloader_straggler_gap_sum"), std::string::npos) << t;
  EXPECT_EQ(t.find("# TYPE recfleet_dataloader_straggler_gap_count"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_queue_depth{rank=\"3\",recfleet_job=\"jobs/a\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE recfleet_dataloader_samples_total counter"), std::string::npos);
  m.EndStream("jobs/a", 3);
  t = m.PrometheusText();
  EXPECT_EQ(t.find("recfleet_dataloader_queue_depth{"), std::string::npos) << t;
  EXPECT_NE(t.find("recfleet_dataloader_samples_total{rank=\"3\",recfleet_job=\"jobs/a\"} 128\n"),
            std::string::npos)
      << t;
}

TEST(LoaderMetricsTest, ClosingAJobRemovesEveryOneOfItsSeries) {
  LoaderMetrics m;
  for (const char* job : {"jobs/a", "jobs/b"}) {
    m.RecordSent(job, 0, 10, 100);
    m.RecordSent(job, 1, 10, 100);
    m.RecordStep(job, 0.001, 0.25);
    m.SetQueueDepth(job, 1, 2);
  }
  m.EndJob("jobs/a");
  const std::string t = m.PrometheusText();
  EXPECT_EQ(t.find("recfleet_job=\"jobs/a\""), std::string::npos) << t;
  // The other job's series stay.
  for (const char* series :
       {"recfleet_dataloader_samples_total{rank=\"0\",recfleet_job=\"jobs/b\"} 10\n",
        "recfleet_dataloader_bytes_total{rank=\"1\",recfleet_job=\"jobs/b\"} 100\n",
        "recfleet_dataloader_straggler_gap{dealing=\"policy\",recfleet_job=\"jobs/b\"} 0.001\n",
        "recfleet_dataloader_step_straggler_gap_ratio_count{dealing=\"naive\",recfleet_job=\"jobs/b\"} 1\n",
        "recfleet_dataloader_queue_depth{rank=\"1\",recfleet_job=\"jobs/b\"} 2\n"}) {
    EXPECT_NE(t.find(series), std::string::npos) << series << " missing from\n" << t;
  }
  m.EndJob("jobs/never-seen");  // No-op.
}

}  // namespace
}  // namespace recfleet::dataloader
