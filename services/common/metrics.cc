#include "services/common/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace recfleet::metrics {
namespace internal {

void Fatal(const std::string& message) {
  std::fprintf(stderr, "recfleet metrics: %s\n", message.c_str());
  std::abort();
}

namespace {

void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  const std::string* le, std::string* out) {
  if (names.empty() && le == nullptr) return;
  out->push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (le != nullptr) absl::StrAppend(out, names.empty() ? "" : ",", "le=\"", *le, "\"");
  out->push_back('}');
}

void AppendLine(const std::string& name, const std::vector<std::string>& names,
                const std::vector<std::string>& values, const std::string* le, double v,
                std::string* out) {
  out->append(name);
  AppendLabels(names, values, le, out);
  absl::StrAppend(out, " ", FormatValue(v), "\n");
}

}  // namespace

void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Counter& c, std::string* out) {
  AppendLine(name, label_names, values, nullptr, c.Value(), out);
}

void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Gauge& g, std::string* out) {
  AppendLine(name, label_names, values, nullptr, g.Value(), out);
}

void AppendSeries(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const Histogram& h, std::string* out) {
  Histogram::Snapshot s = h.Take();
  const std::string bucket = name + "_bucket";
  for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
    std::string le = i < s.upper_bounds.size() ? FormatValue(s.upper_bounds[i]) : "+Inf";
    AppendLine(bucket, label_names, values, &le, static_cast<double>(s.cumulative[i]), out);
  }
  AppendLine(name + "_sum", label_names, values, nullptr, s.sum, out);
  AppendLine(name + "_count", label_names, values, nullptr, static_cast<double>(s.count), out);
}

}  // namespace internal

namespace {

// std::atomic<double>::fetch_add is C++20; a CAS loop does the same.
void AtomicAdd(std::atomic<double>& target, double amount) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

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

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount >= 0)) return;
  AtomicAdd(value_, amount);
}

void Gauge::Add(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 1; i < bounds_.size(); ++i) {
    if (!(bounds_[i] > bounds_[i - 1])) {
      internal::Fatal("histogram bounds must be strictly increasing, got " +
                      FormatValue(bounds_[i - 1]) + " then " + FormatValue(bounds_[i]));
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  // Buckets are few (tens); a linear scan beats a binary search here.
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  // A concurrent Observe may have bumped a bucket but not yet the count;
  // report the bucket total so that count == the +Inf bucket, as required.
  s.count = running;
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

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  // The shortest of %.15g / %.17g that round-trips.
  std::snprintf(buf, sizeof(buf), "%.15g", value);
  if (std::strtod(buf, nullptr) != value) std::snprintf(buf, sizeof(buf), "%.17g", value);
  return buf;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void MetricRegistry::CheckNewName(const std::string& name,
                                  const std::vector<std::string>& labels) {
  if (!ValidName(name, /*allow_colon=*/true)) {
    internal::Fatal("invalid metric name '" + name + "': must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  for (const Entry& e : entries_) {
    if (e.name == name) internal::Fatal("metric " + name + " registered twice");
  }
  for (const std::string& l : labels) {
    if (!ValidName(l, /*allow_colon=*/false) || l.rfind("__", 0) == 0 || l == "le") {
      internal::Fatal("metric " + name + ": invalid label name '" + l +
                      "': must match [a-zA-Z_][a-zA-Z0-9_]*, not start with __, not be le");
    }
  }
}

template <typename T>
Family<T>& MetricRegistry::Add(const std::string& name, const std::string& help,
                               const char* type, std::vector<std::string> label_names,
                               std::function<std::unique_ptr<T>()> make) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name, label_names);
  auto* family = new Family<T>(name, std::move(label_names), std::move(make));
  entries_.push_back(Entry{name, help, type, std::unique_ptr<internal::FamilyBase>(family)});
  return *family;
}

Family<Counter>& MetricRegistry::AddCounter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  return Add<Counter>(name, help, "counter", std::move(label_names),
                      [] { return std::make_unique<Counter>(); });
}

Family<Gauge>& MetricRegistry::AddGauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, "gauge", std::move(label_names),
                    [] { return std::make_unique<Gauge>(); });
}

Family<Histogram>& MetricRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> upper_bounds) {
  // Validate the bounds now rather than at the first WithLabels.
  Histogram check(upper_bounds);
  return Add<Histogram>(name, help, "histogram", std::move(label_names),
                        [upper_bounds] { return std::make_unique<Histogram>(upper_bounds); });
}

void MetricRegistry::AddCollector(std::function<void()> collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricRegistry::Render() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) c();
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const Entry& e : entries_) {
    absl::StrAppend(&out, "# HELP ", e.name, " ", EscapeHelp(e.help), "\n");
    absl::StrAppend(&out, "# TYPE ", e.name, " ", e.type, "\n");
    e.family->AppendAll(&out);
  }
  return out;
}

}  // namespace recfleet::metrics
