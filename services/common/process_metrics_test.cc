#include "services/common/process_metrics.h"

#include <ctime>

#include "gtest/gtest.h"
#include "services/common/exposition.h"

namespace recfleet {
namespace {

TEST(ProcessMetricsTest, ReportsCpuMemoryAndStartTime) {
  metrics::MetricRegistry registry;
  AddProcessMetrics(&registry);
  absl::StatusOr<metrics::Exposition> before = metrics::ParseExposition(registry.Render());
  ASSERT_TRUE(before.ok()) << before.status();
  // Burn some CPU so the counter must move.
  volatile double x = 0;
  const double cpu0 = ProcessCpuSeconds();
  while (ProcessCpuSeconds() - cpu0 < 0.05) x = x + 1;
  absl::StatusOr<metrics::Exposition> after = metrics::ParseExposition(registry.Render());
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after->samples.at("process_cpu_seconds_total") -
                before->samples.at("process_cpu_seconds_total"),
            0.04);
  EXPECT_EQ(after->types.at("process_cpu_seconds_total"), "counter");
  EXPECT_GT(after->samples.at("process_resident_memory_bytes"), 1 << 20);
  const double start = after->samples.at("process_start_time_seconds");
  EXPECT_LE(start, std::time(nullptr) + 1);
  EXPECT_GT(start, std::time(nullptr) - 3600);  // Tests start within the hour.
}

}  // namespace
}  // namespace recfleet
