#include "services/common/metrics.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/exposition.h"

namespace recfleet::metrics {
namespace {

TEST(MetricsTest, RendersTextFormat004) {
  MetricRegistry r;
  r.AddCounter("recfleet_requests_total", "Requests.", {"method"})
      .WithLabels({"Get"})
      .Increment(3);
  r.AddGauge("recfleet_queue_length", "Queued items.").Get().Set(2.5);
  auto& h = r.AddHistogram("recfleet_latency_seconds", "Latency.", {}, {0.1, 1});
  h.Get().Observe(0.05);
  h.Get().Observe(0.5);
  h.Get().Observe(7);
  EXPECT_EQ(r.Render(),
            "# HELP recfleet_requests_total Requests.\n"
            "# TYPE recfleet_requests_total counter\n"
            "recfleet_requests_total{method=\"Get\"} 3\n"
            "# HELP recfleet_queue_length Queued items.\n"
            "# TYPE recfleet_queue_length gauge\n"
            "recfleet_queue_length 2.5\n"
            "# HELP recfleet_latency_seconds Latency.\n"
            "# TYPE recfleet_latency_seconds histogram\n"
            "recfleet_latency_seconds_bucket{le=\"0.1\"} 1\n"
            "recfleet_latency_seconds_bucket{le=\"1\"} 2\n"
            "recfleet_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "recfleet_latency_seconds_sum 7.55\n"
            "recfleet_latency_seconds_count 3\n");
}

TEST(MetricsTest, LabelsAreEscapedAndParseBack) {
  MetricRegistry r;
  auto& c = r.AddCounter("recfleet_errors_total", "Errors by message.\nSecond line \\ end.",
                         {"message", "code"});
  c.WithLabels({"quote \" back\\slash\nnewline", "5"}).Increment();
  c.WithLabels({"plain", "3"}).Increment(2);
  absl::StatusOr<Exposition> e = ParseExposition(r.Render());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->types.at("recfleet_errors_total"), "counter");
  EXPECT_EQ(e->help.at("recfleet_errors_total"), "Errors by message.\nSecond line \\ end.");
  EXPECT_EQ(e->samples.at(R"(recfleet_errors_total{message="plain",code="3"})"), 2);
  EXPECT_EQ(
      e->samples.at(R"(recfleet_errors_total{message="quote \" back\\slash\nnewline",code="5"})"),
      1);
}

TEST(MetricsTest, HistogramWithLabelsPutsLeLast) {
  MetricRegistry r;
  auto& h = r.AddHistogram("recfleet_rpc_duration_seconds", "RPC time.", {"method"},
                           ExponentialBuckets(0.001, 10, 3));
  h.WithLabels({"Heartbeat"}).Observe(0.002);
  absl::StatusOr<Exposition> e = ParseExposition(r.Render());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->samples.at(R"(recfleet_rpc_duration_seconds_bucket{method="Heartbeat",le="0.001"})"), 0);
  EXPECT_EQ(e->samples.at(R"(recfleet_rpc_duration_seconds_bucket{method="Heartbeat",le="0.01"})"), 1);
  EXPECT_EQ(e->samples.at(R"(recfleet_rpc_duration_seconds_bucket{method="Heartbeat",le="+Inf"})"), 1);
  EXPECT_EQ(e->samples.at(R"(recfleet_rpc_duration_seconds_count{method="Heartbeat"})"), 1);
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricRegistry r;
  auto& counters = r.AddCounter("recfleet_ops_total", "Ops.", {"worker"});
  auto& gauge = r.AddGauge("recfleet_level", "Level.").Get();
  auto& hist = r.AddHistogram("recfleet_op_seconds", "Op time.", {}, {0.5}).Get();
  constexpr int kThreads = 4, kOps = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        counters.WithLabels({"shared"}).Increment();
        counters.WithLabels({std::to_string(t)}).Increment(0.5);
        gauge.Add(1);
        hist.Observe(i % 2 == 0 ? 0.25 : 0.75);
      }
    });
  }
  // Rendering while writers run must always produce a parsable text.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(ParseExposition(r.Render()).ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(counters.WithLabels({"shared"}).Value(), kThreads * kOps);
  EXPECT_EQ(counters.WithLabels({"2"}).Value(), kOps * 0.5);
  EXPECT_EQ(gauge.Value(), kThreads * kOps);
  Histogram::Snapshot s = hist.Take();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads * kOps));
  EXPECT_EQ(s.cumulative[0], static_cast<uint64_t>(kThreads * kOps / 2));
  EXPECT_DOUBLE_EQ(s.sum, kThreads * kOps / 2 * (0.25 + 0.75));
}

TEST(MetricsTest, CounterIgnoresNegativeAmounts) {
  Counter c;
  c.Increment(2);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_EQ(c.Value(), 2);
}

TEST(MetricsTest, RemovedSeriesLeaveTheExposition) {
  MetricRegistry registry;
  auto& info = registry.AddGauge("demo_info", "Info.", {"name"});
  info.WithLabels({"a"}).Set(1);
  info.WithLabels({"b"}).Set(1);
  EXPECT_TRUE(info.Remove({"a"}));
  EXPECT_FALSE(info.Remove({"a"}));
  const std::string text = registry.Render();
  EXPECT_EQ(text.find("demo_info{name=\"a\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("demo_info{name=\"b\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, CollectorsRunBeforeRender) {
  MetricRegistry r;
  auto& g = r.AddGauge("recfleet_jobs", "Jobs by state.", {"state"});
  int calls = 0;
  r.AddCollector([&] { g.WithLabels({"RUNNING"}).Set(++calls); });
  r.Render();
  absl::StatusOr<Exposition> e = ParseExposition(r.Render());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->samples.at(R"(recfleet_jobs{state="RUNNING"})"), 2);
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-12), "-12");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");  // Needs 17 digits.
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(MetricsDeathTest, InvalidNamesAbortWithTheName) {
  MetricRegistry r;
  EXPECT_DEATH(r.AddCounter("bad-name", "x"), "invalid metric name 'bad-name'");
  EXPECT_DEATH(r.AddCounter("recfleet_x_total", "x", {"le"}), "invalid label name 'le'");
  auto& c = r.AddCounter("recfleet_y_total", "y", {"a"});
  EXPECT_DEATH(c.WithLabels({"1", "2"}), "has 1 labels, WithLabels got 2");
  EXPECT_DEATH(r.AddGauge("recfleet_y_total", "again"), "registered twice");
  EXPECT_DEATH(r.AddHistogram("recfleet_h", "h", {}, {1, 1}), "strictly increasing");
}

TEST(ExpositionTest, RejectsMalformedText) {
  EXPECT_FALSE(ParseExposition("recfleet_x 1\n").ok());  // No TYPE.
  EXPECT_FALSE(ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x one\n").ok());
  EXPECT_FALSE(ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x{a=b} 1\n").ok());
  EXPECT_FALSE(ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x{a=\"b} 1\n").ok());
  EXPECT_FALSE(ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x 1\nrecfleet_x 2\n").ok());
  EXPECT_FALSE(ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x 1").ok());
  absl::StatusOr<Exposition> e =
      ParseExposition("# TYPE recfleet_x gauge\nrecfleet_x{a=\"b\"} +Inf 1700000000\n");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(std::isinf(e->samples.at("recfleet_x{a=\"b\"}")));
}

}  // namespace
}  // namespace recfleet::metrics
