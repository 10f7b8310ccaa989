#ifndef RECFLEET_ENGINE_TRAINER_H_
#define RECFLEET_ENGINE_TRAINER_H_

// The single-process trainer: one model, one device (the CPU reference
// kernels). Shuffles the training set each epoch with a seeded generator,
// runs ForwardBackward + ApplyUpdates per batch, evaluates the CTR head on
// the held-out set after every epoch and reports progress through a
// callback. Given the same dataset, config and options, the parameters and
// metrics are bit-identical from run to run, except that a wall-clock
// budget (time_budget_s) may stop training at a different step.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dataset.h"
#include "engine/metrics.h"
#include "engine/model.h"

namespace recfleet::engine {

struct TrainerOptions {
  int64_t batch_size = 256;
  int epochs = 3;
  // Stop after this many steps in total (0: no limit).
  int64_t max_steps = 0;
  // Stop starting new steps once this much wall time has passed since the
  // start of training (0: no limit); the final evaluation still runs.
  double time_budget_s = 0;
  int64_t log_every = 50;  // Steps between progress lines (0: none).
  uint64_t seed = 1;       // Shuffling.
  int64_t eval_batch_size = 1024;
  // Threads, each with a model replica working on a slice of every batch
  // (see GemLite::AddGradients). Results depend on the thread count only
  // through float summation order.
  int threads = 1;
};

struct EpochReport {
  int epoch = 0;          // 1-based.
  int64_t steps = 0;      // Cumulative.
  double train_loss = 0;  // Mean CTR loss over the epoch's steps.
  BinaryMetrics eval;
  double wall_s = 0;      // Since the start of training, after evaluation.
  double cpu_s = 0;       // Process CPU time, same span.
};

struct TrainReport {
  std::vector<EpochReport> epochs;
  int64_t steps = 0;
  int64_t samples = 0;
  double flops = 0;         // Model FLOPs of all training steps.
  double train_wall_s = 0;  // Time inside training steps only.
  double wall_s = 0;
  double cpu_s = 0;
  bool stopped_by_budget = false;
  const EpochReport& final() const { return epochs.back(); }
};

class Trainer {
 public:
  using Logger = std::function<void(const std::string& line)>;
  // `model` and `data` must outlive the trainer. `log` may be empty.
  Trainer(GemLite<float>* model, const Dataset* data, TrainerOptions options, Logger log);

  absl::StatusOr<TrainReport> Run();
  // CTR metrics of the current model on the evaluation set.
  absl::StatusOr<BinaryMetrics> Evaluate();

 private:
  GemLite<float>* Replica(int r);
  // One optimizer step on `samples` (training-set indices), split across
  // the replicas.
  absl::StatusOr<StepResult> Step(absl::Span<const int64_t> samples);

  GemLite<float>* model_;
  std::vector<std::unique_ptr<GemLite<float>>> replicas_;  // threads - 1 of them.
  const Dataset* data_;
  TrainerOptions options_;
  Logger log_;
};

// Process CPU time (user + system) in seconds.
double ProcessCpuSeconds();

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TRAINER_H_
