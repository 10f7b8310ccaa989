#ifndef RECFLEET_ENGINE_QUALITY_GATE_H_
#define RECFLEET_ENGINE_QUALITY_GATE_H_

// The low-precision recipe's quality gate (JobSpec
// model.precision.quality_gate): the CTR head's eval NE of the model under
// its recipe against the same model without it (every linear at the job's
// precision, bf16 on CUDA), each trained from the same initial parameters
// on the same batches. The worker runs it as a shadow run before a job's
// first step (worker/rank_run.h); engine_bench --ne-baseline reports the
// same comparison next to its speed.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace recfleet::engine {

struct NeComparison {
  double recipe_ne = 0;
  double baseline_ne = 0;
  int steps = 0;              // Training steps of each model.
  int64_t eval_samples = 0;   // Samples the NEs are over.
  // (recipe - baseline) / baseline: > 0 when the recipe is worse.
  double relative_increase() const { return (recipe_ne - baseline_ne) / baseline_ne; }
  // "eval NE 0.81234 (recipe) vs 0.81200 (bf16): +0.04% after 200 steps, 65536 samples".
  std::string Describe() const;
};

// `config` without its low-precision recipe (no FP8 modules, no FP8
// all-gather): the gate's baseline.
GemLiteConfig WithoutLowPrecision(GemLiteConfig config);

// OK when comparison.relative_increase() <= max_relative_increase, else
// FailedPrecondition naming both NEs, the tolerance and what to change.
absl::Status CheckNeGate(const NeComparison& comparison, double max_relative_increase);

// Trains a fresh model of `config` (tables internal) under `exec` for
// `steps` steps, step s on *batch(s) (valid until the next call; an error
// stops the run), then returns the CTR head's NE over
// `eval`.
absl::StatusOr<double> TrainedEvalNe(const GemLiteConfig& config, const FeatureSchema& schema,
                                     const ExecutionOptions& exec, int steps,
                                     const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                     const std::vector<Batch>& eval);

// TrainedEvalNe of `config` and of WithoutLowPrecision(config) on the same
// batches, one model on the device at a time.
absl::StatusOr<NeComparison> RunShadowComparison(const GemLiteConfig& config, const FeatureSchema& schema,
                                                 const ExecutionOptions& exec, int steps,
                                                 const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                                 const std::vector<Batch>& eval);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_QUALITY_GATE_H_
