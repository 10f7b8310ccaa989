#include "services/common/metrics.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
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
  const std::string text = r.Render();
  absl::StatusOr<Exposition> e = ParseExposition(text);
  ASSERT_TRUE(e.ok()) << e.status() << "\n" << text;
  EXPECT_EQ(e->types, (std::map<std::string, std::string>{{"recfleet_requests_total", "counter"},
                                                          {"recfleet_queue_length", "gauge"},
                                                          {"recfleet_latency_seconds", "histogram"}}));
  EXPECT_EQ(e->help.at("recfleet_latency_seconds"), "Latency.");
  EXPECT_EQ(e->samples, (std::map<std::string, double>{
                            {"recfleet_requests_total{method=\"Get\"}", 3},
                            {"recfleet_queue_length", 2.5},
                            {"recfleet_latency_seconds_bucket{le=\"0.1\"}", 1},
                            {"recfleet_latency_seconds_bucket{le=\"1\"}", 2},
                            {"recfleet_latency_seconds_bucket{le=\"+Inf\"}", 3},
                            {"recfleet_latency_seconds_sum", 7.55},
                            {"recfleet_latency_seconds_count", 3},
                        }));
}

TEST(MetricsTest, AValueOnABoundCountsInThatBucket) {
  MetricRegistry r;
  auto& h = r.AddHistogram("recfleet_size_bytes", "Sizes.", {}, {1, 2}).Get();
  h.Observe(1);
  h.Observe(2);
  h.Observe(2.5);
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.upper_bounds, (std::vector<double>{1, 2}));
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(s.count, 3u);
  EXPECT_EQ(s.sum, 5.5);
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
  // Labels come out sorted by name, whatever the declaration order.
  EXPECT_EQ(e->samples.at(R"(recfleet_errors_total{code="3",message="plain"})"), 2);
  EXPECT_EQ(
      e->samples.at(R"(recfleet_errors_total{code="5",message="quote \" back\\slash\nnewline"})"),
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
  MetricRegistry r;
  Counter& c = r.AddCounter("recfleet_c_total", "C.").Get();
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
  auto& h = registry.AddHistogram("demo_seconds", "Time.", {"name"}, {1});
  h.WithLabels({"a"}).Observe(1);
  h.WithLabels({"b"}).Observe(1);
  EXPECT_TRUE(h.Remove({"b"}));
  const std::string text = registry.Render();
  EXPECT_EQ(text.find("demo_info{name=\"a\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("demo_info{name=\"b\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("demo_seconds_count{name=\"a\"} 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("demo_seconds_count{name=\"b\"}"), std::string::npos) << text;
  // A removed series comes back from zero if its labels are used again.
  info.WithLabels({"a"}).Add(2);
  EXPECT_NE(registry.Render().find("demo_info{name=\"a\"} 2\n"), std::string::npos);
}

TEST(MetricsTest, CollectableOutlivingTheRegistryIsEmpty) {
  std::shared_ptr<prometheus::Collectable> held;
  int calls = 0;
  {
    MetricRegistry r;
    r.AddGauge("recfleet_g", "G.").Get().Set(1);
    r.AddCollector([&calls] { ++calls; });
    held = r.collectable();
    EXPECT_EQ(held->Collect().size(), 1u);
    EXPECT_EQ(calls, 1);
  }
  EXPECT_TRUE(held->Collect().empty());
  EXPECT_EQ(calls, 1);  // The destroyed owner's collector did not run.
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

TEST(MetricsTest, SpecialValuesRoundTrip) {
  MetricRegistry r;
  auto& g = r.AddGauge("recfleet_v", "V.", {"k"});
  const std::map<std::string, double> values = {
      {"zero", 0},           {"neg", -12},     {"big", 1e15}, {"tenth", 0.1},
      {"huge", 1e300},
      {"inf", std::numeric_limits<double>::infinity()},
      {"ninf", -std::numeric_limits<double>::infinity()},
  };
  for (const auto& [k, v] : values) g.WithLabels({k}).Set(v);
  g.WithLabels({"nan"}).Set(std::nan(""));
  absl::StatusOr<Exposition> e = ParseExposition(r.Render());
  ASSERT_TRUE(e.ok()) << e.status();
  for (const auto& [k, v] : values) {
    EXPECT_EQ(e->samples.at("recfleet_v{k=\"" + k + "\"}"), v) << k;
  }
  EXPECT_TRUE(std::isnan(e->samples.at("recfleet_v{k=\"nan\"}")));
  // prometheus-cpp 1.0.1 prints 16 significant digits: a double that needs
  // 17 to round-trip comes back within one part in 1e15.
  g.WithLabels({"sum"}).Set(0.1 + 0.2);
  e = ParseExposition(r.Render());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->samples.at("recfleet_v{k=\"sum\"}"), 0.1 + 0.2, 1e-15);
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
