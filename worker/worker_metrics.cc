#include "worker/worker_metrics.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace recfleet::worker {
namespace {

constexpr absl::Duration kRateWindow = absl::Seconds(2);

}  // namespace

double PeakBf16FlopsOf(const std::string& device_name) {
  // Dense bf16 tensor-core peak of the SXM parts (H100 and H200 share it).
  if (absl::StrContains(device_name, "H100") || absl::StrContains(device_name, "H200")) return 989e12;
  return 0;
}

std::string MfuSummary(double flops, double compute_seconds, double step_seconds, double peak_flops,
                       const std::string& peak_source) {
  const MfuRatios r = ComputeMfu(flops, compute_seconds, step_seconds, peak_flops);
  if (peak_flops <= 0) {
    return absl::StrFormat("local MFU n/a, scaling ratio %.4f, E2E MFU n/a (%s)", r.scaling_ratio, peak_source);
  }
  return absl::StrFormat("local MFU %.4f, scaling ratio %.4f, E2E MFU %.4f (peak %.3g FLOP/s, %s)", r.local_mfu,
                         r.scaling_ratio, r.e2e_mfu, peak_flops, peak_source);
}

MfuRatios ComputeMfu(double flops, double compute_seconds, double step_seconds, double peak_flops) {
  MfuRatios r;
  if (peak_flops > 0 && compute_seconds > 0) r.local_mfu = flops / (compute_seconds * peak_flops);
  if (step_seconds > 0) r.scaling_ratio = compute_seconds / step_seconds;
  if (peak_flops > 0 && step_seconds > 0) r.e2e_mfu = flops / (step_seconds * peak_flops);
  return r;
}

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
          registry_.AddGauge("recfleet_worker_checkpoint_seconds", "Wall time of the last checkpoint.").Get()),
      mfu_(registry_.AddGauge("recfleet_worker_mfu",
                              "Local MFU, ratio 0..1: useful model FLOPs (real jagged lengths) / (compute time x "
                              "recfleet_worker_peak_flops), recent window.")),
      scaling_ratio_(registry_.AddGauge("recfleet_worker_scaling_ratio",
                                        "Compute time / step time, recent window (1 = no exposed data wait or "
                                        "communication).")),
      e2e_mfu_(registry_.AddGauge("recfleet_worker_e2e_mfu",
                                  "E2E MFU, ratio 0..1: local MFU x scaling ratio = useful FLOPs / (step time x "
                                  "peak), recent window.")),
      peak_flops_(registry_.AddGauge("recfleet_worker_peak_flops",
                                     "Peak FLOP/s MFU divides by (dense bf16 datasheet peak of the GPU; a nominal "
                                     "value on CPU ranks).")),
      exposed_comm_seconds_(registry_
                                .AddGauge("recfleet_worker_exposed_comm_seconds",
                                          "Communication time per step that compute did not hide, mean over the "
                                          "recent window.")
                                .Get()) {}

void WorkerMetrics::StartTask(const std::string& job, int rank, int world_size, double peak_flops) {
  absl::MutexLock lock(&mu_);
  if (!task_labels_.empty()) task_info_.Remove(task_labels_);
  task_labels_ = {job, std::to_string(rank), std::to_string(world_size)};
  task_info_.WithLabels(task_labels_).Set(1);
  window_start_ = absl::Now();
  window_samples_ = window_flops_ = rate_samples_ = rate_flops_ = 0;
  window_compute_ = window_comm_ = window_step_ = window_steps_ = 0;
  mfu_value_ = MfuRatios();
  peak_flops_value_ = peak_flops;
  // Without a peak there is no MFU: no series rather than a false 0. The
  // previous task's ratios go too.
  for (metrics::Family<metrics::Gauge>* f : {&mfu_, &scaling_ratio_, &e2e_mfu_, &peak_flops_}) f->Remove({});
  if (peak_flops > 0) peak_flops_.Get().Set(peak_flops);
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
  window_compute_ += times.compute_seconds;
  window_comm_ += times.comm_seconds;
  window_step_ += times.step_seconds;
  window_steps_ += 1;
  const double span = absl::ToDoubleSeconds(absl::Now() - window_start_);
  if (span >= absl::ToDoubleSeconds(kRateWindow) || rate_samples_ == 0) {
    if (span > 0) {
      rate_samples_ = window_samples_ / span;
      rate_flops_ = window_flops_ / span;
      samples_per_second_.Set(rate_samples_);
      useful_flops_per_second_.Set(rate_flops_);
    }
    mfu_value_ = ComputeMfu(window_flops_, window_compute_, window_step_, peak_flops_value_);
    exposed_comm_seconds_.Set(window_comm_ / window_steps_);
    scaling_ratio_.Get().Set(mfu_value_.scaling_ratio);
    if (peak_flops_value_ > 0) {
      mfu_.Get().Set(mfu_value_.local_mfu);
      e2e_mfu_.Get().Set(mfu_value_.e2e_mfu);
    }
    if (span >= absl::ToDoubleSeconds(kRateWindow)) {
      window_start_ = absl::Now();
      window_samples_ = window_flops_ = 0;
      window_compute_ = window_comm_ = window_step_ = window_steps_ = 0;
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

MfuRatios WorkerMetrics::mfu() const {
  absl::MutexLock lock(&mu_);
  return mfu_value_;
}

}  // namespace recfleet::worker
