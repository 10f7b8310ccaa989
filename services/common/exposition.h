#ifndef RECFLEET_SERVICES_COMMON_EXPOSITION_H_
#define RECFLEET_SERVICES_COMMON_EXPOSITION_H_

// Parses the Prometheus text exposition format 0.0.4 strictly enough to
// catch malformed output: used by tests and benchmarks that scrape /metrics.
// (prometheus-cpp writes the format but reads none of it.)

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace recfleet::metrics {

struct Exposition {
  // Series key (name plus the label set exactly as rendered,
  // e.g. `recfleet_jobs{state="QUEUED"}`; prometheus-cpp sorts labels by
  // name, `le` last) -> value.
  std::map<std::string, double> samples;
  // Metric family name -> "counter" | "gauge" | "histogram" | ...
  std::map<std::string, std::string> types;
  // Metric family name -> HELP text (unescaped).
  std::map<std::string, std::string> help;
};

// Errors: INVALID_ARGUMENT naming the 1-based line and what is wrong
// (a sample before its TYPE, a bad label set, an unparsable value, ...).
absl::StatusOr<Exposition> ParseExposition(const std::string& text);

}  // namespace recfleet::metrics

#endif  // RECFLEET_SERVICES_COMMON_EXPOSITION_H_
