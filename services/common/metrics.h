#ifndef RECFLEET_SERVICES_COMMON_METRICS_H_
#define RECFLEET_SERVICES_COMMON_METRICS_H_

// recfleet's metric API: counters, gauges and histograms with labels, kept in
// a prometheus-cpp registry (Debian's prometheus-cpp 1.0.1) and rendered in
// the Prometheus text format (what GET /metrics serves, see http_server.h).
//
//   MetricRegistry registry;
//   auto& rpcs = registry.AddCounter("recfleet_rpcs_total", "RPCs handled.",
//                                    {"method", "code"});
//   rpcs.WithLabels({"CreateJob", "OK"}).Increment();
//   std::string text = registry.Render();
//
// The classes here keep the positional-label API the services were written
// against (label values in the order the names were declared) on top of
// prometheus-cpp's map-of-labels families. The text format prints a series'
// labels sorted by name (`le` last), whatever the declaration order, and
// values with 16 significant digits (so the last bit of a double may not
// survive a scrape).
//
// Naming follows Prometheus conventions: a `recfleet_` prefix, base units
// (`_seconds`, `_bytes`), counters end in `_total`. Metric and label names are
// program constants; an invalid one (or a WithLabels call with the wrong
// number of values) is a programming error and aborts at the call with a
// message naming it.
//
// Thread-safety: every method of every class here may be called from any
// thread. Counter and Gauge updates are lock-free atomics; a Histogram
// observation takes that series' own mutex (prometheus-cpp); WithLabels takes
// a per-family lock to find or create the series. References returned by
// Add* and WithLabels stay valid for the registry's lifetime (a series'
// until it is removed).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace recfleet::metrics {

template <typename T>
class Family;

// A value that only goes up (events, bytes, seconds spent).
class Counter {
 public:
  using Impl = prometheus::Counter;
  // `amount` must be >= 0; negative and NaN amounts are ignored (a counter
  // that went down, or became NaN, would break rate()).
  void Increment(double amount = 1.0);
  double Value() const { return impl_.Value(); }

 private:
  template <typename>
  friend class Family;
  explicit Counter(Impl& impl) : impl_(impl) {}
  Impl& impl_;
};

// A value that goes up and down (queue length, jobs in a state).
class Gauge {
 public:
  using Impl = prometheus::Gauge;
  void Set(double value) { impl_.Set(value); }
  void Add(double amount) { impl_.Increment(amount); }
  double Value() const { return impl_.Value(); }

 private:
  template <typename>
  friend class Family;
  explicit Gauge(Impl& impl) : impl_(impl) {}
  Impl& impl_;
};

// Counts observations into cumulative buckets (e.g. RPC latency). A value
// equal to a bound counts in that bound's bucket (`le`).
class Histogram {
 public:
  using Impl = prometheus::Histogram;
  void Observe(double value) { impl_.Observe(value); }

  struct Snapshot {
    std::vector<double> upper_bounds;  // Without +Inf.
    std::vector<uint64_t> cumulative;  // One per bound, then +Inf.
    double sum = 0;
    uint64_t count = 0;
  };
  // A consistent view (taken under the series' lock).
  Snapshot Take() const;

 private:
  template <typename>
  friend class Family;
  explicit Histogram(Impl& impl) : impl_(impl) {}
  Impl& impl_;
};

// `count` bounds start, start*factor, ...; start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Bounds for RPC and request latencies in seconds: 50 us .. ~6.5 s.
std::vector<double> LatencyBuckets();

namespace internal {
[[noreturn]] void Fatal(const std::string& message);

// Creates (or finds) the prometheus-cpp series with these labels.
prometheus::Counter& AddSeries(prometheus::Family<prometheus::Counter>& family,
                               const prometheus::Labels& labels, const std::vector<double>& bounds);
prometheus::Gauge& AddSeries(prometheus::Family<prometheus::Gauge>& family,
                             const prometheus::Labels& labels, const std::vector<double>& bounds);
prometheus::Histogram& AddSeries(prometheus::Family<prometheus::Histogram>& family,
                                 const prometheus::Labels& labels,
                                 const std::vector<double>& bounds);

// What the registry owns of a family, whatever its metric type.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
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
  bool Remove(const std::vector<std::string>& values);

 private:
  friend class MetricRegistry;
  Family(std::string name, std::vector<std::string> label_names, std::vector<double> bounds,
         prometheus::Family<typename T::Impl>& impl)
      : name_(std::move(name)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)),
        impl_(impl) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // Histograms only.
  prometheus::Family<typename T::Impl>& impl_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families and renders them.
class MetricRegistry {
 public:
  MetricRegistry();
  ~MetricRegistry();
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

  // Runs before every Render() and every scrape, e.g. to set gauges from a
  // store's counts. Collectors run in registration order, under no registry
  // lock.
  void AddCollector(std::function<void()> collector);

  // The Prometheus text format (0.0.4) of every family, via prometheus-cpp's
  // TextSerializer.
  std::string Render() const;

  // What a prometheus-cpp Exposer registers: collecting it runs the
  // collectors, then collects every family. It outlives the registry only as
  // an empty collection (an Exposer holds it weakly).
  std::shared_ptr<prometheus::Collectable> collectable() const;

 private:
  class Collected;
  template <typename T>
  Family<T>& Add(const std::string& name, const std::string& help,
                 std::vector<std::string> label_names, std::vector<double> bounds);
  void CheckNewName(const std::string& name, const std::vector<std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::set<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Collected> collectable_;
};

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    internal::Fatal("metric " + name_ + " has " + std::to_string(label_names_.size()) +
                    " labels, WithLabels got " + std::to_string(values.size()) + " values");
  }
  absl::MutexLock lock(&mu_);
  auto& slot = series_[values];
  if (slot == nullptr) {
    prometheus::Labels labels;
    for (size_t i = 0; i < values.size(); ++i) labels[label_names_[i]] = values[i];
    slot.reset(new T(internal::AddSeries(impl_, labels, bounds_)));
  }
  return *slot;
}

template <typename T>
bool Family<T>::Remove(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(values);
  if (it == series_.end()) return false;
  impl_.Remove(&it->second->impl_);
  series_.erase(it);
  return true;
}

}  // namespace recfleet::metrics

#endif  // RECFLEET_SERVICES_COMMON_METRICS_H_
