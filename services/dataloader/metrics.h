#ifndef RECFLEET_SERVICES_DATALOADER_METRICS_H_
#define RECFLEET_SERVICES_DATALOADER_METRICS_H_

// The data loader's metrics, kept in a shared metrics::MetricRegistry
// (services/common/metrics.h) that `recfleet data serve` exposes at
// /metrics. Thread-safe.
//
// Exported (all prefixed recfleet_dataloader_):
//   samples_total{recfleet_job, rank}, bytes_total{recfleet_job, rank}   counters
//   samples_per_second, bytes_per_second            rates over the last 10 s
//   steps_total                                      steps dealt
//   straggler_gap{recfleet_job, dealing="naive"|"policy"}   last step's gap
//   step_straggler_gap_ratio{recfleet_job, dealing}         histogram of the
//       per-step gaps (_bucket, _sum, _count: the mean gap and its quantiles)
//   queue_depth{recfleet_job, rank}                  prefetched batches waiting
//       (removed when the rank's stream ends)
// A job's series are removed when the loader closes the job (EndJob).

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "services/common/metrics.h"

namespace recfleet::dataloader {

class LoaderMetrics {
 public:
  LoaderMetrics();

  // Per job (label recfleet_job: Prometheus reserves "job" for the target).
  void RecordStep(const std::string& job, double policy_gap, double naive_gap);
  void RecordSent(const std::string& job, int rank, int64_t samples, int64_t bytes);
  void SetQueueDepth(const std::string& job, int rank, int depth);
  // A rank's stream ended: its queue_depth series goes away (rather than
  // staying at 0 for a job that no longer streams here).
  void EndStream(const std::string& job, int rank);
  // The loader closed `job`: every series labelled with it goes away
  // (samples, bytes, straggler gaps, queue depths).
  void EndJob(const std::string& job);
  void SetOpenJobs(int jobs);

  const metrics::MetricRegistry& registry() const { return registry_; }
  std::string PrometheusText() const { return registry_.Render(); }

 private:
  // Events per one-second bucket over a sliding window.
  struct Rate {
    static constexpr int kBuckets = 11;
    int64_t second[kBuckets] = {};
    double sum[kBuckets] = {};
    void Add(int64_t now_s, double v);
    double PerSecond(int64_t now_s) const;  // Over the last kBuckets - 1 full seconds.
  };
  int64_t Now() const;

  metrics::MetricRegistry registry_;
  metrics::Family<metrics::Counter>& samples_;
  metrics::Family<metrics::Counter>& bytes_;
  metrics::Gauge& samples_per_second_;
  metrics::Gauge& bytes_per_second_;
  metrics::Counter& steps_;
  metrics::Family<metrics::Gauge>& gap_;
  metrics::Family<metrics::Histogram>& gap_histogram_;
  metrics::Family<metrics::Gauge>& queue_depth_;
  metrics::Gauge& open_jobs_;

  const std::chrono::steady_clock::time_point start_;
  mutable absl::Mutex mu_;
  // The rank label values seen per job, to remove its series by name.
  std::map<std::string, std::set<std::string>> job_ranks_ ABSL_GUARDED_BY(mu_);
  Rate sample_rate_ ABSL_GUARDED_BY(mu_);
  Rate byte_rate_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_METRICS_H_
