#ifndef RECFLEET_SERVICES_COMMON_RPC_METRICS_H_
#define RECFLEET_SERVICES_COMMON_RPC_METRICS_H_

// Server-side RPC latency, exported as
//   recfleet_rpc_duration_seconds{service, method, code}  (histogram)
// whose _count doubles as the request counter. Thread-safe.

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/metrics.h"

namespace recfleet {

// Registers recfleet_rpc_duration_seconds on `registry`; once per registry.
metrics::Family<metrics::Histogram>& AddRpcDurationHistogram(metrics::MetricRegistry* registry);

class RpcMetrics {
 public:
  // `family` from AddRpcDurationHistogram; `service` becomes the label value,
  // e.g. "recfleet.v1.JobService".
  RpcMetrics(metrics::Family<metrics::Histogram>* family, std::string service)
      : family_(family), service_(std::move(service)) {}

  // `method` must be a string literal (series are cached by its address).
  void Observe(const char* method, absl::StatusCode code, absl::Duration elapsed);

 private:
  metrics::Family<metrics::Histogram>* const family_;
  const std::string service_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<const char*, int>, metrics::Histogram*> cache_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_RPC_METRICS_H_
