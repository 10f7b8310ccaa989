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
  // The standard error of relative_increase() over the eval samples
  // (PairedRelativeSe); < 0 when not measured. It says how far another
  // draw of as many eval samples would move the comparison of these two
  // trained models, not how far another training run would.
  double relative_se = -1;
  // With the gate's `runs` >= 2: each run's relative increase (the first is
  // recipe_ne against baseline_ne), every run training both models afresh
  // on the same batches from the same parameters.
  std::vector<double> run_increases;
  // (recipe - baseline) / baseline, > 0 when the recipe is worse; the mean
  // of run_increases where there are two or more.
  double relative_increase() const;
  // The standard error of the mean of run_increases (their s.d. / sqrt(n)):
  // how far the training's own noise moves the comparison (GPU kernels that
  // accumulate with atomics are not bitwise reproducible, and short runs
  // amplify that); < 0 with fewer than two runs.
  double run_se() const;
  // What the gate holds against its tolerance: the eval and the run
  // standard errors combined (sqrt of the sum of squares of those measured),
  // < 0 when neither is.
  double noise_se() const;
  // "eval NE 0.81234 (recipe) vs 0.81200 (bf16): +0.042% +- 0.011% (s.e. over
  // the eval samples) after 200 steps, 65536 samples", and over runs
  // "; over 2 runs +0.030% +- 0.012% (s.e. over the runs: +0.042%, +0.018%)".
  std::string Describe() const;
};

// The standard error of the relative NE increase of the model with logits
// `recipe` over the model with logits `baseline`, both scored on the same
// samples with 0/1 `labels`: the ratio sum(l_r - l_b) / sum(l_b) of the
// per-sample log losses (the NEs' common normalizer cancels), linearized,
// s.e. = sqrt(sum(e_i^2) / (n (n - 1))) / mean(l_b) with e_i = l_r,i - l_b,i
// - R l_b,i. Paired: what the two models share per sample cancels, so
// it is far smaller than either NE's own standard error. InvalidArgument
// for sizes that differ or fewer than two samples.
absl::StatusOr<double> PairedRelativeSe(const std::vector<double>& recipe, const std::vector<double>& baseline,
                                        const std::vector<double>& labels);

// `config` without its low-precision recipe (no FP8 modules, no FP8
// all-gather): the gate's baseline.
GemLiteConfig WithoutLowPrecision(GemLiteConfig config);
// `exec` without FP8-saved activations: the baseline's execution (the
// activation checkpointing stays).
ExecutionOptions WithoutLowPrecision(ExecutionOptions exec);

// OK when comparison.relative_increase() <= max_relative_increase, else
// FailedPrecondition naming both NEs, the tolerance and what to change.
// Also FailedPrecondition ("cannot resolve") when the comparison's
// relative_se, where measured, exceeds max_relative_increase: a gate whose
// eval-sample noise alone is larger than its tolerance would pass or fail by
// chance; the message says how many eval samples would bring the standard
// error to half the tolerance. Likewise when noise_se(), which adds the
// spread over the gate's runs where it had two or more, exceeds it.
absl::Status CheckNeGate(const NeComparison& comparison, double max_relative_increase);

// Trains a fresh model of `config` (tables internal) under `exec` for
// `steps` steps, step s on *batch(s) (valid until the next call; an error
// stops the run), then returns the CTR head's NE over
// `eval`.
absl::StatusOr<double> TrainedEvalNe(const GemLiteConfig& config, const FeatureSchema& schema,
                                     const ExecutionOptions& exec, int steps,
                                     const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                     const std::vector<Batch>& eval);

// TrainedEvalNe of `config` under `exec` and of WithoutLowPrecision(config)
// under WithoutLowPrecision(exec) on the same batches, one model on the device at a time, with the paired standard
// error of the comparison over the eval samples; `runs` >= 2 trains both
// models that many times (run_increases).
absl::StatusOr<NeComparison> RunShadowComparison(const GemLiteConfig& config, const FeatureSchema& schema,
                                                 const ExecutionOptions& exec, int steps,
                                                 const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                                 const std::vector<Batch>& eval, int runs = 1);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_QUALITY_GATE_H_
