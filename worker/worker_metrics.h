#ifndef RECFLEET_WORKER_WORKER_METRICS_H_
#define RECFLEET_WORKER_WORKER_METRICS_H_

// The worker's Prometheus metrics (served at /metrics): throughput, the
// step-time split into data wait / compute / exposed communication, useful
// FLOP rate (model FLOPs from the real jagged lengths, never padding), MFU
// (DESIGN section 3: local MFU = useful FLOPs / (compute time x peak),
// scaling ratio = compute time / step time, E2E MFU = their product), and
// the model's training loss and latest eval AUC / NE. Rates and ratios are
// over a window of the last few seconds of steps. One worker runs one
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

// The peak MFU divides by on a CPU rank: one core of the fp32 reference
// kernels, nominally 2 FMA units x 8 fp32 lanes x 2 FLOP x 3 GHz = 96
// GFLOP/s, rounded to 1e11. A nominal figure for comparing CPU runs with
// each other, not a measured ceiling.
inline constexpr double kCpuNominalPeakFlops = 1e11;

// Dense bf16 peak FLOP/s of a CUDA device by its name (cudaDeviceProp::name):
// 989e12 for H100 and H200 (SXM datasheet); 0 when unknown (MFU is then not
// exported unless the worker is given --peak_flops).
double PeakBf16FlopsOf(const std::string& device_name);

// MFU figures of a window of steps; every field is 0 when its denominator is.
struct MfuRatios {
  double local_mfu = 0;      // flops / (compute_seconds * peak)
  double scaling_ratio = 0;  // compute_seconds / step_seconds
  double e2e_mfu = 0;        // local_mfu * scaling_ratio = flops / (step_seconds * peak)
};
MfuRatios ComputeMfu(double flops, double compute_seconds, double step_seconds, double peak_flops);

// The MFU figures of a summary line: "local MFU 0.4123, scaling ratio
// 0.9100, E2E MFU 0.3752 (peak 9.89e+14 FLOP/s, <peak_source>)", or, when
// `peak_flops` is 0 (no known peak), "local MFU n/a, scaling ratio 0.9100,
// E2E MFU n/a (<peak_source>)" with `peak_source` saying why: never an MFU
// of 0 that only means "unknown".
std::string MfuSummary(double flops, double compute_seconds, double step_seconds, double peak_flops,
                       const std::string& peak_source);

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

  // A new task: resets the rate windows and names the task. `peak_flops`
  // is the device's peak that MFU divides by (0: MFU series not exported).
  void StartTask(const std::string& job, int rank, int world_size, double peak_flops = 0);
  // The task ended (done, failed or stopped): its info series goes away.
  void EndTask();
  void RecordStep(int64_t step, int64_t samples, double useful_flops, double loss, const StepTimes& times);
  void RecordEval(double auc, double ne);
  void RecordCheckpoint(double seconds);

  // Samples/s, useful FLOP/s and MFU over the recent window (for logs).
  double samples_per_second() const;
  double useful_flops_per_second() const;
  MfuRatios mfu() const;

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
  metrics::Family<metrics::Gauge>& mfu_;  // No series until a peak is known.
  metrics::Family<metrics::Gauge>& scaling_ratio_;
  metrics::Family<metrics::Gauge>& e2e_mfu_;
  metrics::Family<metrics::Gauge>& peak_flops_;
  metrics::Gauge& exposed_comm_seconds_;

  mutable absl::Mutex mu_;
  std::vector<std::string> task_labels_ ABSL_GUARDED_BY(mu_);
  // Rate window: restarted once it spans more than a few seconds.
  absl::Time window_start_ ABSL_GUARDED_BY(mu_);
  double window_samples_ ABSL_GUARDED_BY(mu_) = 0;
  double window_flops_ ABSL_GUARDED_BY(mu_) = 0;
  double window_compute_ ABSL_GUARDED_BY(mu_) = 0;
  double window_comm_ ABSL_GUARDED_BY(mu_) = 0;
  double window_step_ ABSL_GUARDED_BY(mu_) = 0;
  double window_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double rate_samples_ ABSL_GUARDED_BY(mu_) = 0;
  double rate_flops_ ABSL_GUARDED_BY(mu_) = 0;
  double peak_flops_value_ ABSL_GUARDED_BY(mu_) = 0;
  MfuRatios mfu_value_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_WORKER_METRICS_H_
