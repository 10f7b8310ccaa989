#include "worker/worker_metrics.h"

#include <string>

namespace recfleet::worker {
namespace {

constexpr absl::Duration kRateWindow = absl::Seconds(2);

}  // namespace

WorkerMetrics::WorkerMetrics()
    : task_info_(registry_.AddGauge("recfleet_worker_task_info", "1 for the task this worker runs.",
                                    {"recfleet_job", "rank", "world_size"})),
      step_(registry_.AddGauge("recfleet_worker_step", "Last training step finished.").Get()),
      samples_total_(registry_.AddCounter("recfleet_worker_samples_total", "Training samples processed.").Get()),
      samples_per_second_(
          registry_.AddGauge("recfleet_worker_samples_per_second", "Training samples per second, recent window.")
              .Get()),
      useful_flops_total_(
          registry_.AddCounter("recfleet_worker_useful_flops_total",
                               "Model FLOPs of training steps, from the real jagged lengths (no padding).")
              .Get()),
      useful_flops_per_second_(registry_
                                   .AddGauge("recfleet_worker_useful_flops_per_second",
                                             "Useful model FLOP/s over the recent window (the basis of MFU).")
                                   .Get()),
      step_seconds_(registry_
                        .AddHistogram("recfleet_worker_step_seconds", "Wall time of a training step.", {},
                                      metrics::ExponentialBuckets(0.001, 2, 16))
                        .Get()),
      last_step_phase_(registry_.AddGauge("recfleet_worker_last_step_phase_seconds",
                                          "The last step's time by phase: data_wait, compute, comm.", {"phase"})),
      phase_seconds_total_(registry_.AddCounter("recfleet_worker_step_phase_seconds_total",
                                                "Step time spent by phase: data_wait, compute, comm.", {"phase"})),
      loss_(registry_.AddGauge("recfleet_worker_loss", "Training loss of the last step's local batch.").Get()),
      eval_auc_(registry_.AddGauge("recfleet_worker_eval_auc", "AUC of the latest evaluation (rank 0).").Get()),
      eval_ne_(registry_.AddGauge("recfleet_worker_eval_ne", "Normalized entropy of the latest evaluation.").Get()),
      checkpoints_total_(registry_.AddCounter("recfleet_worker_checkpoints_total", "Checkpoint shards written.").Get()),
      checkpoint_seconds_(
          registry_.AddGauge("recfleet_worker_checkpoint_seconds", "Wall time of the last checkpoint.").Get()) {}

void WorkerMetrics::StartTask(const std::string& job, int rank, int world_size) {
  absl::MutexLock lock(&mu_);
  if (!task_labels_.empty()) task_info_.Remove(task_labels_);
  task_labels_ = {job, std::to_string(rank), std::to_string(world_size)};
  task_info_.WithLabels(task_labels_).Set(1);
  window_start_ = absl::Now();
  window_samples_ = window_flops_ = rate_samples_ = rate_flops_ = 0;
}

void WorkerMetrics::EndTask() {
  absl::MutexLock lock(&mu_);
  if (!task_labels_.empty()) task_info_.Remove(task_labels_);
  task_labels_.clear();
}

void WorkerMetrics::RecordStep(int64_t step, int64_t samples, double useful_flops, double loss,
                               const StepTimes& times) {
  step_.Set(static_cast<double>(step));
  samples_total_.Increment(static_cast<double>(samples));
  useful_flops_total_.Increment(useful_flops);
  step_seconds_.Observe(times.step_seconds);
  const std::pair<const char*, double> phases[] = {
      {"data_wait", times.data_wait_seconds}, {"compute", times.compute_seconds}, {"comm", times.comm_seconds}};
  for (const auto& [phase, seconds] : phases) {
    last_step_phase_.WithLabels({phase}).Set(seconds);
    phase_seconds_total_.WithLabels({phase}).Increment(seconds);
  }
  loss_.Set(loss);
  absl::MutexLock lock(&mu_);
  window_samples_ += static_cast<double>(samples);
  window_flops_ += useful_flops;
  const double span = absl::ToDoubleSeconds(absl::Now() - window_start_);
  if (span >= absl::ToDoubleSeconds(kRateWindow) || rate_samples_ == 0) {
    if (span > 0) {
      rate_samples_ = window_samples_ / span;
      rate_flops_ = window_flops_ / span;
      samples_per_second_.Set(rate_samples_);
      useful_flops_per_second_.Set(rate_flops_);
    }
    if (span >= absl::ToDoubleSeconds(kRateWindow)) {
      window_start_ = absl::Now();
      window_samples_ = window_flops_ = 0;
    }
  }
}

void WorkerMetrics::RecordEval(double auc, double ne) {
  eval_auc_.Set(auc);
  eval_ne_.Set(ne);
}

void WorkerMetrics::RecordCheckpoint(double seconds) {
  checkpoints_total_.Increment();
  checkpoint_seconds_.Set(seconds);
}

double WorkerMetrics::samples_per_second() const {
  absl::MutexLock lock(&mu_);
  return rate_samples_;
}

double WorkerMetrics::useful_flops_per_second() const {
  absl::MutexLock lock(&mu_);
  return rate_flops_;
}

}  // namespace recfleet::worker
