#include "services/common/metrics.h"

#include <cstdio>
#include <cstdlib>

#include "prometheus/text_serializer.h"

namespace recfleet::metrics {
namespace internal {

void Fatal(const std::string& message) {
  std::fprintf(stderr, "recfleet metrics: %s\n", message.c_str());
  std::abort();
}

prometheus::Counter& AddSeries(prometheus::Family<prometheus::Counter>& family,
                               const prometheus::Labels& labels, const std::vector<double>&) {
  return family.Add(labels);
}

prometheus::Gauge& AddSeries(prometheus::Family<prometheus::Gauge>& family,
                             const prometheus::Labels& labels, const std::vector<double>&) {
  return family.Add(labels);
}

prometheus::Histogram& AddSeries(prometheus::Family<prometheus::Histogram>& family,
                                 const prometheus::Labels& labels,
                                 const std::vector<double>& bounds) {
  return family.Add(labels, bounds);
}

}  // namespace internal

namespace {

bool ValidName(const std::string& name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// prometheus-cpp 1.0.1 writes HELP text verbatim, so a newline in it would
// end the line early; the format wants backslash and newline escaped.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void CheckBounds(const std::vector<double>& bounds) {
  for (size_t i = 1; i < bounds.size(); ++i) {
    if (!(bounds[i] > bounds[i - 1])) {
      internal::Fatal("histogram bounds must be strictly increasing, got " +
                      std::to_string(bounds[i - 1]) + " then " + std::to_string(bounds[i]));
    }
  }
}

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount >= 0)) return;  // prometheus-cpp drops negatives but adds NaN.
  impl_.Increment(amount);
}

Histogram::Snapshot Histogram::Take() const {
  prometheus::ClientMetric m = impl_.Collect();
  Snapshot s;
  for (const auto& b : m.histogram.bucket) {
    s.cumulative.push_back(b.cumulative_count);
    if (s.cumulative.size() < m.histogram.bucket.size()) s.upper_bounds.push_back(b.upper_bound);
  }
  s.sum = m.histogram.sample_sum;
  s.count = m.histogram.sample_count;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    internal::Fatal("ExponentialBuckets needs start > 0, factor > 1, count >= 1");
  }
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> LatencyBuckets() { return ExponentialBuckets(50e-6, 2.0, 18); }

// The registry's families plus its collectors, as prometheus-cpp collects
// them. An Exposer may hold it (weakly, locking it per scrape) past the
// MetricRegistry; Close() waits out a scrape in progress and empties it, so
// no collector runs on a destroyed owner.
class MetricRegistry::Collected : public prometheus::Collectable {
 public:
  explicit Collected(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)) {}

  void Add(std::function<void()> collector) {
    absl::MutexLock lock(&list_mu_);
    collectors_.push_back(std::move(collector));
  }

  void Close() {
    absl::WriterMutexLock lock(&collect_mu_);
    closed_ = true;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::ReaderMutexLock collecting(&collect_mu_);
    if (closed_) return {};
    std::vector<std::function<void()>> collectors;
    {
      absl::MutexLock lock(&list_mu_);
      collectors = collectors_;
    }
    for (const auto& c : collectors) c();
    return registry_->Collect();
  }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex collect_mu_;
  bool closed_ ABSL_GUARDED_BY(collect_mu_) = false;
  mutable absl::Mutex list_mu_;
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(list_mu_);
};

MetricRegistry::MetricRegistry()
    : registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<Collected>(registry_)) {}

MetricRegistry::~MetricRegistry() { collectable_->Close(); }

std::shared_ptr<prometheus::Collectable> MetricRegistry::collectable() const {
  return collectable_;
}

void MetricRegistry::CheckNewName(const std::string& name,
                                  const std::vector<std::string>& labels) {
  if (!ValidName(name, /*allow_colon=*/true)) {
    internal::Fatal("invalid metric name '" + name + "': must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  if (names_.count(name)) internal::Fatal("metric " + name + " registered twice");
  for (const std::string& l : labels) {
    if (!ValidName(l, /*allow_colon=*/false) || l.rfind("__", 0) == 0 || l == "le") {
      internal::Fatal("metric " + name + ": invalid label name '" + l +
                      "': must match [a-zA-Z_][a-zA-Z0-9_]*, not start with __, not be le");
    }
  }
  names_.insert(name);
}

template <typename T>
Family<T>& MetricRegistry::Add(const std::string& name, const std::string& help,
                               std::vector<std::string> label_names, std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name, label_names);
  auto& impl = prometheus::detail::Builder<typename T::Impl>()
                   .Name(name)
                   .Help(EscapeHelp(help))
                   .Register(*registry_);
  auto* family = new Family<T>(name, std::move(label_names), std::move(bounds), impl);
  families_.emplace_back(family);
  return *family;
}

Family<Counter>& MetricRegistry::AddCounter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  return Add<Counter>(name, help, std::move(label_names), {});
}

Family<Gauge>& MetricRegistry::AddGauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, std::move(label_names), {});
}

Family<Histogram>& MetricRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> upper_bounds) {
  CheckBounds(upper_bounds);
  return Add<Histogram>(name, help, std::move(label_names), std::move(upper_bounds));
}

void MetricRegistry::AddCollector(std::function<void()> collector) {
  collectable_->Add(std::move(collector));
}

std::string MetricRegistry::Render() const {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

}  // namespace recfleet::metrics
