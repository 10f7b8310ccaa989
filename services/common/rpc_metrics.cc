#include "services/common/rpc_metrics.h"

namespace recfleet {

metrics::Family<metrics::Histogram>& AddRpcDurationHistogram(metrics::MetricRegistry* registry) {
  return registry->AddHistogram("recfleet_rpc_duration_seconds",
                                "Server-side RPC handling time by method and status code.",
                                {"service", "method", "code"}, metrics::LatencyBuckets());
}

void RpcMetrics::Observe(const char* method, absl::StatusCode code, absl::Duration elapsed) {
  metrics::Histogram* h;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = cache_[{method, static_cast<int>(code)}];
    if (slot == nullptr) {
      slot = &family_->WithLabels({service_, method, absl::StatusCodeToString(code)});
    }
    h = slot;
  }
  h->Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace recfleet
