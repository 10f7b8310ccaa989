#ifndef RECFLEET_SERVICES_DATALOADER_METRICS_H_
#define RECFLEET_SERVICES_DATALOADER_METRICS_H_

// The data loader's metrics and their Prometheus text exposition, plus a
// minimal HTTP server that serves them at /metrics. The service records
// through LoaderMetrics only, so moving to a shared metrics library later
// touches this file alone. Thread-safe.
//
// Exported (all prefixed recfleet_dataloader_):
//   samples_total{rank}, bytes_total{rank}          counters of data sent
//   samples_per_second, bytes_per_second            rates over the last 10 s
//   steps_total                                      steps computed
//   straggler_gap{dealing="naive"|"policy"}          last step's gap
//   straggler_gap_sum{dealing}, straggler_gap_count   for the mean gap
//   queue_depth{rank}                                prefetched batches waiting

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace recfleet::dataloader {

class LoaderMetrics {
 public:
  LoaderMetrics();

  void RecordStep(double policy_gap, double naive_gap);
  void RecordSent(int rank, int64_t samples, int64_t bytes);
  void SetQueueDepth(int rank, int depth);

  std::string PrometheusText() const;

 private:
  // Events per one-second bucket over a sliding window.
  struct Rate {
    static constexpr int kBuckets = 11;
    int64_t second[kBuckets] = {};
    double sum[kBuckets] = {};
    void Add(int64_t now_s, double v);
    double PerSecond(int64_t now_s) const;  // Over the last kBuckets - 1 full seconds.
  };

  mutable absl::Mutex mu_;
  std::map<int, int64_t> samples_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> bytes_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> queue_depth_ ABSL_GUARDED_BY(mu_);
  Rate sample_rate_ ABSL_GUARDED_BY(mu_);
  Rate byte_rate_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_gap_[2] ABSL_GUARDED_BY(mu_) = {0, 0};  // naive, policy
  double gap_sum_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  std::chrono::steady_clock::time_point start_;
};

// Serves GET /metrics (HTTP/1.0, one request per connection) from a
// background thread; anything else gets 404.
class MetricsHttpServer {
 public:
  // Binds host:port (port 0: the OS picks; see port()).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, std::function<std::string()> render);
  ~MetricsHttpServer();  // Stops and joins.

  int port() const { return port_; }

 private:
  MetricsHttpServer(int fd, int port, std::function<std::string()> render);
  void Serve();

  int fd_;
  int port_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_METRICS_H_
