#include "worker/worker_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

// The value of the unlabelled series `name` in exposition text `t`, or -1
// when it is absent (parsed, so the test holds whatever number format the
// exposition uses).
double SeriesValue(const std::string& t, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = t.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(t.substr(at + key.size(), t.find('\n', at + 1) - at - key.size()));
}

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

TEST(WorkerMetricsTest, MfuRatiosFollowTheDefinitions) {
  // 4e12 FLOPs in 8 ms of compute out of a 10 ms step on a 1e15 FLOP/s part:
  // local MFU 0.5, scaling ratio 0.8, E2E MFU 0.4.
  const MfuRatios r = ComputeMfu(4e12, 0.008, 0.010, 1e15);
  EXPECT_DOUBLE_EQ(r.local_mfu, 0.5);
  EXPECT_DOUBLE_EQ(r.scaling_ratio, 0.8);
  EXPECT_DOUBLE_EQ(r.e2e_mfu, 0.4);
  EXPECT_DOUBLE_EQ(r.local_mfu * r.scaling_ratio, r.e2e_mfu);
  // No peak: no MFU, but the scaling ratio stands.
  const MfuRatios none = ComputeMfu(4e12, 0.008, 0.010, 0);
  EXPECT_EQ(none.local_mfu, 0);
  EXPECT_EQ(none.e2e_mfu, 0);
  EXPECT_DOUBLE_EQ(none.scaling_ratio, 0.8);
}

TEST(WorkerMetricsTest, PeakByDeviceName) {
  EXPECT_EQ(PeakBf16FlopsOf("NVIDIA H200"), 989e12);
  EXPECT_EQ(PeakBf16FlopsOf("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(PeakBf16FlopsOf("NVIDIA A100-SXM4-80GB"), 0);
}

TEST(WorkerMetricsTest, ExportsMfuScalingRatioAndExposedComm) {
  WorkerMetrics m;
  m.StartTask("jobs/a", 0, 1, 1e12);
  StepTimes times;
  times.step_seconds = 0.010;
  times.compute_seconds = 0.005;
  times.comm_seconds = 0.002;
  times.data_wait_seconds = 0.003;
  m.RecordStep(1, 64, 2.5e9, 0.7, times);  // 2.5e9 / (0.005 x 1e12) = 0.5
  const std::string t = m.registry().Render();
  EXPECT_DOUBLE_EQ(SeriesValue(t, "recfleet_worker_mfu"), 0.5) << t;
  EXPECT_DOUBLE_EQ(SeriesValue(t, "recfleet_worker_scaling_ratio"), 0.5) << t;
  EXPECT_DOUBLE_EQ(SeriesValue(t, "recfleet_worker_e2e_mfu"), 0.25) << t;
  EXPECT_DOUBLE_EQ(SeriesValue(t, "recfleet_worker_peak_flops"), 1e12) << t;
  EXPECT_DOUBLE_EQ(SeriesValue(t, "recfleet_worker_exposed_comm_seconds"), 0.002) << t;
  EXPECT_DOUBLE_EQ(m.mfu().local_mfu, 0.5);
  // A task without a known peak exports no MFU series at all (not a 0 that
  // a dashboard would read as an idle GPU).
  m.StartTask("jobs/b", 0, 1, 0);
  m.RecordStep(1, 64, 2.5e9, 0.7, times);
  const std::string u = m.registry().Render();
  EXPECT_EQ(SeriesValue(u, "recfleet_worker_mfu"), -1) << u;
  EXPECT_EQ(SeriesValue(u, "recfleet_worker_peak_flops"), -1) << u;
  EXPECT_DOUBLE_EQ(SeriesValue(u, "recfleet_worker_scaling_ratio"), 0.5) << u;
}

TEST(MfuSummaryTest, SaysNotApplicableWithTheReasonInsteadOfZero) {
  const std::string known = MfuSummary(4e12, 0.008, 0.010, 1e15, "dense bf16 datasheet of NVIDIA H200");
  EXPECT_EQ(known,
            "local MFU 0.5000, scaling ratio 0.8000, E2E MFU 0.4000 (peak 1e+15 FLOP/s, dense bf16 datasheet of "
            "NVIDIA H200)");
  const std::string unknown = MfuSummary(4e12, 0.008, 0.010, 0, "CPU rank: no known peak FLOP/s");
  EXPECT_EQ(unknown, "local MFU n/a, scaling ratio 0.8000, E2E MFU n/a (CPU rank: no known peak FLOP/s)");
}

}  // namespace
}  // namespace recfleet::worker
