#ifndef RECFLEET_WORKER_WORKER_METRICS_H_
#define RECFLEET_WORKER_WORKER_METRICS_H_

// The worker's Prometheus metrics (served at /metrics): throughput, the
// step-time split into data wait / compute / exposed communication, useful
// FLOP rate (model FLOPs from the real jagged lengths, never padding), and
// the model's training loss and latest eval AUC / NE. One worker runs one
// task at a time, so series carry no job label; `recfleet_worker_task_info`
// names the job and rank (label `recfleet_job`: Prometheus sets `job` to the
// scrape target's job), and the recording rules join on it to aggregate per
// job. A finished task's info series is removed, not set to 0, so that join
// never sees two tasks on one instance. Thread-safe (see
// services/common/metrics.h).

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/metrics.h"

namespace recfleet::worker {

struct StepTimes {
  double data_wait_seconds = 0;
  double compute_seconds = 0;
  double comm_seconds = 0;
  double step_seconds = 0;
};

class WorkerMetrics {
 public:
  WorkerMetrics();

  const metrics::MetricRegistry& registry() const { return registry_; }

  // A new task: resets the rate windows and names the task.
  void StartTask(const std::string& job, int rank, int world_size);
  // The task ended (done, failed or stopped): its info series goes away.
  void EndTask();
  void RecordStep(int64_t step, int64_t samples, double useful_flops, double loss, const StepTimes& times);
  void RecordEval(double auc, double ne);
  void RecordCheckpoint(double seconds);

  // Samples/s and useful FLOP/s over the recent window (for logs).
  double samples_per_second() const;
  double useful_flops_per_second() const;

 private:
  metrics::MetricRegistry registry_;
  metrics::Family<metrics::Gauge>& task_info_;
  metrics::Gauge& step_;
  metrics::Counter& samples_total_;
  metrics::Gauge& samples_per_second_;
  metrics::Counter& useful_flops_total_;
  metrics::Gauge& useful_flops_per_second_;
  metrics::Histogram& step_seconds_;
  metrics::Family<metrics::Gauge>& last_step_phase_;
  metrics::Family<metrics::Counter>& phase_seconds_total_;
  metrics::Gauge& loss_;
  metrics::Gauge& eval_auc_;
  metrics::Gauge& eval_ne_;
  metrics::Counter& checkpoints_total_;
  metrics::Gauge& checkpoint_seconds_;

  mutable absl::Mutex mu_;
  std::vector<std::string> task_labels_ ABSL_GUARDED_BY(mu_);
  // Rate window: restarted once it spans more than a few seconds.
  absl::Time window_start_ ABSL_GUARDED_BY(mu_);
  double window_samples_ ABSL_GUARDED_BY(mu_) = 0;
  double window_flops_ ABSL_GUARDED_BY(mu_) = 0;
  double rate_samples_ ABSL_GUARDED_BY(mu_) = 0;
  double rate_flops_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_WORKER_METRICS_H_
