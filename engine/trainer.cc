#include "engine/trainer.h"

#include <ctime>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"

namespace recfleet::engine {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Trainer::Trainer(GemLite<float>* model, const Dataset* data, TrainerOptions options, Logger log)
    : model_(model), data_(data), options_(std::move(options)), log_(std::move(log)) {}

absl::StatusOr<BinaryMetrics> Trainer::Evaluate() {
  std::vector<double> logits, labels;
  std::vector<int64_t> idx;
  const int64_t n = data_->num_eval();
  const int64_t bs = std::max<int64_t>(1, options_.eval_batch_size);
  for (int64_t start = 0; start < n; start += bs) {
    idx.resize(std::min(bs, n - start));
    std::iota(idx.begin(), idx.end(), start);
    const Batch batch = data_->MakeBatch(/*eval=*/true, idx);
    absl::StatusOr<std::vector<double>> z = model_->Predict(batch, Head::kCtr);
    if (!z.ok()) return z.status();
    logits.insert(logits.end(), z->begin(), z->end());
    labels.insert(labels.end(), batch.ctr_labels.begin(), batch.ctr_labels.end());
  }
  return ComputeBinaryMetrics(logits, labels);
}

absl::StatusOr<TrainReport> Trainer::Run() {
  if (options_.batch_size < 1 || options_.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train.batch_size and train.epochs must be >= 1, got %d and %d", options_.batch_size,
        options_.epochs));
  }
  if (data_->num_train() < 1 || data_->num_eval() < 1) {
    return absl::InvalidArgumentError("dataset needs training and evaluation samples");
  }
  TrainReport report;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ProcessCpuSeconds();
  std::mt19937_64 rng(options_.seed);
  std::vector<int64_t> order(data_->num_train());
  for (int epoch = 1; epoch <= options_.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0, window_loss = 0;
    int64_t epoch_steps = 0, window_steps = 0;
    double window_flops = 0, window_samples = 0;
    auto window_start = std::chrono::steady_clock::now();
    for (int64_t begin = 0; begin < data_->num_train(); begin += options_.batch_size) {
      if (options_.max_steps > 0 && report.steps >= options_.max_steps) break;
      if (options_.time_budget_s > 0 && Seconds(start) >= options_.time_budget_s) {
        report.stopped_by_budget = true;
        break;
      }
      const int64_t end = std::min<int64_t>(begin + options_.batch_size, data_->num_train());
      const auto step_start = std::chrono::steady_clock::now();
      const Batch batch = data_->MakeBatch(
          /*eval=*/false, absl::MakeConstSpan(order.data() + begin, end - begin));
      absl::StatusOr<StepResult> step = model_->ForwardBackward(batch);
      if (!step.ok()) return step.status();
      if (absl::Status s = model_->ApplyUpdates(); !s.ok()) return s;
      report.train_wall_s += Seconds(step_start);
      ++report.steps;
      ++epoch_steps;
      ++window_steps;
      report.samples += batch.size;
      report.flops += step->flops;
      loss_sum += step->ctr_loss;
      window_loss += step->ctr_loss;
      window_flops += step->flops;
      window_samples += static_cast<double>(batch.size);
      if (log_ && options_.log_every > 0 && report.steps % options_.log_every == 0) {
        const double dt = Seconds(window_start);
        log_(absl::StrFormat(
            "epoch %d step %d  loss %.4f  %.0f samples/s  %.2f GFLOP/s  wall %.1fs cpu %.1fs", epoch,
            report.steps, window_loss / window_steps, window_samples / dt,
            window_flops / dt * 1e-9, Seconds(start), ProcessCpuSeconds() - cpu_start));
        window_loss = window_flops = window_samples = 0;
        window_steps = 0;
        window_start = std::chrono::steady_clock::now();
      }
    }
    if (epoch_steps == 0) break;
    EpochReport e;
    e.epoch = epoch;
    e.steps = report.steps;
    e.train_loss = loss_sum / epoch_steps;
    absl::StatusOr<BinaryMetrics> eval = Evaluate();
    if (!eval.ok()) return eval.status();
    e.eval = *eval;
    e.wall_s = Seconds(start);
    e.cpu_s = ProcessCpuSeconds() - cpu_start;
    if (log_) {
      log_(absl::StrFormat(
          "epoch %d done: train loss %.4f | eval AUC %.4f  NE %.4f  loss %.4f (%d samples)  "
          "wall %.1fs cpu %.1fs",
          epoch, e.train_loss, e.eval.auc, e.eval.normalized_entropy, e.eval.log_loss,
          e.eval.count, e.wall_s, e.cpu_s));
    }
    report.epochs.push_back(e);
    if (report.stopped_by_budget ||
        (options_.max_steps > 0 && report.steps >= options_.max_steps)) {
      break;
    }
  }
  if (report.epochs.empty()) {
    return absl::FailedPreconditionError("no training step ran (budget or max_steps too small)");
  }
  report.wall_s = Seconds(start);
  report.cpu_s = ProcessCpuSeconds() - cpu_start;
  return report;
}

}  // namespace recfleet::engine
