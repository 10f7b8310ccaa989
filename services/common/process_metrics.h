#ifndef RECFLEET_SERVICES_COMMON_PROCESS_METRICS_H_
#define RECFLEET_SERVICES_COMMON_PROCESS_METRICS_H_

// The standard Prometheus process metrics, read at scrape time:
//   process_cpu_seconds_total       user + system CPU (getrusage)
//   process_resident_memory_bytes   resident set size
//   process_start_time_seconds      start time, Unix seconds
// Benchmarks read the first to report a server's CPU use.

#include "services/common/metrics.h"

namespace recfleet {

// Registers the three families and a collector on `registry`; once per registry.
void AddProcessMetrics(metrics::MetricRegistry* registry);

// User + system CPU seconds of this process so far.
double ProcessCpuSeconds();

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_PROCESS_METRICS_H_
