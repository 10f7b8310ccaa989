#include "engine/trainer.h"

#include <ctime>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>
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

GemLite<float>* Trainer::Replica(int r) { return r == 0 ? model_ : replicas_[r - 1].get(); }

absl::StatusOr<BinaryMetrics> Trainer::Evaluate() {
  const int64_t n = data_->num_eval();
  const int64_t bs = std::max<int64_t>(1, options_.eval_batch_size);
  const int64_t num_batches = (n + bs - 1) / bs;
  std::vector<absl::StatusOr<std::vector<double>>> logits(num_batches);
  std::vector<std::vector<float>> labels(num_batches);
  const int workers = static_cast<int>(replicas_.size()) + 1;
  auto work = [&](int r) {
    std::vector<int64_t> idx;
    for (int64_t k = r; k < num_batches; k += workers) {
      idx.resize(std::min(bs, n - k * bs));
      std::iota(idx.begin(), idx.end(), k * bs);
      const Batch batch = data_->MakeBatch(/*eval=*/true, idx);
      logits[k] = Replica(r)->Predict(batch, Head::kCtr);
      labels[k] = batch.ctr_labels;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < workers; ++r) threads.emplace_back(work, r);
  work(0);
  for (std::thread& t : threads) t.join();
  std::vector<double> all_logits, all_labels;
  for (int64_t k = 0; k < num_batches; ++k) {
    if (!logits[k].ok()) return logits[k].status();
    all_logits.insert(all_logits.end(), logits[k]->begin(), logits[k]->end());
    all_labels.insert(all_labels.end(), labels[k].begin(), labels[k].end());
  }
  return ComputeBinaryMetrics(all_logits, all_labels);
}

absl::StatusOr<StepResult> Trainer::Step(absl::Span<const int64_t> samples) {
  const int64_t n = static_cast<int64_t>(samples.size());
  const int workers = static_cast<int>(std::min<int64_t>(replicas_.size() + 1, n));
  std::vector<absl::StatusOr<StepResult>> results(workers);
  std::vector<int64_t> sizes(workers);
  auto work = [&](int r) {
    const int64_t begin = n * r / workers, end = n * (r + 1) / workers;
    sizes[r] = end - begin;
    results[r] = Replica(r)->ForwardBackward(
        data_->MakeBatch(/*eval=*/false, samples.subspan(begin, end - begin)));
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < workers; ++r) threads.emplace_back(work, r);
  work(0);
  for (std::thread& t : threads) t.join();
  StepResult total;
  for (int r = 0; r < workers; ++r) {
    if (!results[r].ok()) return results[r].status();
    const double share = static_cast<double>(sizes[r]) / static_cast<double>(n);
    total.ctr_loss += share * results[r]->ctr_loss;
    total.cvr_loss += share * results[r]->cvr_loss;
    total.flops += results[r]->flops;
    if (r == 0) {
      model_->ScaleGradients(share);
    } else if (absl::Status s = model_->AddGradients(*Replica(r), share); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = model_->ApplyUpdates(); !s.ok()) return s;
  for (auto& replica : replicas_) {
    if (absl::Status s = replica->CopyParametersFrom(*model_); !s.ok()) return s;
  }
  return total;
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
  if (options_.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train.threads must be >= 1, got %d", options_.threads));
  }
  replicas_.clear();
  for (int r = 1; r < options_.threads; ++r) {
    absl::StatusOr<std::unique_ptr<GemLite<float>>> replica = model_->Clone();
    if (!replica.ok()) return replica.status();
    replicas_.push_back(*std::move(replica));
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
      absl::StatusOr<StepResult> step =
          Step(absl::MakeConstSpan(order.data() + begin, end - begin));
      if (!step.ok()) return step.status();
      report.train_wall_s += Seconds(step_start);
      ++report.steps;
      ++epoch_steps;
      ++window_steps;
      report.samples += end - begin;
      report.flops += step->flops;
      loss_sum += step->ctr_loss;
      window_loss += step->ctr_loss;
      window_flops += step->flops;
      window_samples += static_cast<double>(end - begin);
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
