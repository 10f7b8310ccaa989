#ifndef RECFLEET_SERVICES_COMMON_METRICS_H_
#define RECFLEET_SERVICES_COMMON_METRICS_H_

// A small Prometheus client: counters, gauges and histograms with labels,
// rendered in the text exposition format 0.0.4 (what GET /metrics serves).
//
//   MetricRegistry registry;
//   auto& rpcs = registry.AddCounter("recfleet_rpcs_total", "RPCs handled.",
//                                    {"method", "code"});
//   rpcs.WithLabels({"CreateJob", "OK"}).Increment();
//   std::string text = registry.Render();
//
// Naming follows Prometheus conventions: a `recfleet_` prefix, base units
// (`_seconds`, `_bytes`), counters end in `_total`. Metric and label names are
// program constants; an invalid one (or a WithLabels call with the wrong
// number of values) is a programming error and aborts at the call with a
// message naming it.
//
// Thread-safety: every method of every class here may be called from any
// thread. Counter/Gauge/Histogram updates are lock-free; WithLabels takes a
// per-family lock only to find or create the series. References returned by
// Add* and WithLabels stay valid for the registry's lifetime.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace recfleet::metrics {

// A value that only goes up (events, bytes, seconds spent).
class Counter {
 public:
  // `amount` must be >= 0; negative amounts are ignored (a counter that went
  // down would break rate()).
  void Increment(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue length, jobs in a state).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into cumulative buckets (e.g. RPC latency).
class Histogram {
 public:
  // `upper_bounds` strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;     // Without +Inf.
    std::vector<uint64_t> cumulative;     // One per bound, then +Inf.
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1.
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> count_{0};
};

// `count` bounds start, start*factor, ...; start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Bounds for RPC and request latencies in seconds: 50 us .. ~6.5 s.
std::vector<double> LatencyBuckets();

namespace internal {
[[noreturn]] void Fatal(const std::string& message);

// Appends the exposition lines of one series ("name{labels} value").
void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Counter& c, std::string* out);
void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Gauge& g, std::string* out);
void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Histogram& h, std::string* out);

// What the registry needs of a family, whatever its metric type.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual void AppendAll(std::string* out) const = 0;
};
}  // namespace internal

// All series of one metric name, keyed by label values.
template <typename T>
class Family : public internal::FamilyBase {
 public:
  // The series with these label values (one per label name, in order),
  // created on first use.
  T& WithLabels(const std::vector<std::string>& values);
  // The series without labels; only for families declared with no labels.
  T& Get() { return WithLabels({}); }
  // Drops the series with these label values, so that it disappears from
  // the exposition (Prometheus marks it stale) instead of lingering at its
  // last value. References to it from WithLabels become dangling. Returns
  // whether it existed.
  bool Remove(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    return series_.erase(values) > 0;
  }

  void AppendAll(std::string* out) const override {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, series] : series_) {
      internal::AppendSeries(name_, label_names_, values, *series, out);
    }
  }

 private:
  friend class MetricRegistry;
  Family(std::string name, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : name_(std::move(name)), label_names_(std::move(label_names)), make_(std::move(make)) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families and renders them.
class MetricRegistry {
 public:
  MetricRegistry() = default;
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // Registers a family; the name must be new to this registry.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> upper_bounds);

  // Runs before every Render(), e.g. to set gauges from a store's counts.
  // Collectors run in registration order, under no registry lock.
  void AddCollector(std::function<void()> collector);

  // The text exposition format 0.0.4: families in registration order,
  // series sorted by label values.
  std::string Render() const;

 private:
  struct Entry {
    std::string name;
    std::string help;
    std::string type;  // "counter", "gauge", "histogram".
    std::unique_ptr<internal::FamilyBase> family;
  };
  void CheckNewName(const std::string& name, const std::vector<std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename T>
  Family<T>& Add(const std::string& name, const std::string& help, const char* type,
                 std::vector<std::string> label_names, std::function<std::unique_ptr<T>()> make);

  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Prometheus float formatting: integers exactly, "+Inf", "-Inf", "NaN",
// otherwise the shortest round-tripping decimal.
std::string FormatValue(double value);

// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& value);

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    internal::Fatal("metric " + name_ + " has " + std::to_string(label_names_.size()) +
                    " labels, WithLabels got " + std::to_string(values.size()) + " values");
  }
  absl::MutexLock lock(&mu_);
  auto& slot = series_[values];
  if (slot == nullptr) slot = make_();
  return *slot;
}

}  // namespace recfleet::metrics

#endif  // RECFLEET_SERVICES_COMMON_METRICS_H_
