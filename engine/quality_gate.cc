#include "engine/quality_gate.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/metrics.h"

namespace recfleet::engine {

std::string NeComparison::Describe() const {
  return absl::StrFormat("eval NE %.5f (recipe) vs %.5f (bf16): %+.3f%% after %d steps, %lld samples", recipe_ne,
                         baseline_ne, 100 * relative_increase(), steps, static_cast<long long>(eval_samples));
}

GemLiteConfig WithoutLowPrecision(GemLiteConfig config) {
  config.fp8 = Fp8Recipe();
  return config;
}

absl::Status CheckNeGate(const NeComparison& comparison, double max_relative_increase) {
  if (!(comparison.baseline_ne > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.precision.quality_gate: the bf16 shadow model's eval NE is ", comparison.baseline_ne,
        ", so no relative tolerance applies (an eval set of one label?)"));
  }
  if (comparison.relative_increase() <= max_relative_increase) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "model.precision.quality_gate: the low-precision recipe fails its gate: %s, above the tolerance of +%g%%; "
      "name fewer fp8_modules (keep late layers bf16) or fp8_attention blocks, keep weight_gradient BF16, or raise "
      "max_relative_ne_increase",
      comparison.Describe(), 100 * max_relative_increase));
}

absl::StatusOr<double> TrainedEvalNe(const GemLiteConfig& config, const FeatureSchema& schema,
                                     const ExecutionOptions& exec, int steps,
                                     const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                     const std::vector<Batch>& eval) {
  absl::StatusOr<std::unique_ptr<GemLite<float>>> model =
      GemLite<float>::Create(config, schema, TableStorage::kInternal, exec);
  if (!model.ok()) return model.status();
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<const Batch*> b = batch(s);
    if (!b.ok()) return b.status();
    absl::StatusOr<StepResult> r = (*model)->ForwardBackward(**b);
    if (!r.ok()) return r.status();
    if (absl::Status u = (*model)->ApplyUpdates(); !u.ok()) return u;
    if (r->losses_pending) {
      if (absl::Status l = (*model)->ReadLosses(&*r); !l.ok()) return l;
    }
  }
  std::vector<double> logits, labels;
  for (const Batch& b : eval) {
    absl::StatusOr<std::vector<double>> z = (*model)->Predict(b, Head::kCtr);
    if (!z.ok()) return z.status();
    logits.insert(logits.end(), z->begin(), z->end());
    labels.insert(labels.end(), b.ctr_labels.begin(), b.ctr_labels.end());
  }
  absl::StatusOr<BinaryMetrics> metrics = ComputeBinaryMetrics(logits, labels);
  if (!metrics.ok()) return metrics.status();
  return metrics->normalized_entropy;
}

absl::StatusOr<NeComparison> RunShadowComparison(const GemLiteConfig& config, const FeatureSchema& schema,
                                                 const ExecutionOptions& exec, int steps,
                                                 const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                                 const std::vector<Batch>& eval) {
  NeComparison c;
  c.steps = steps;
  for (const Batch& b : eval) c.eval_samples += b.size;
  absl::StatusOr<double> recipe = TrainedEvalNe(config, schema, exec, steps, batch, eval);
  if (!recipe.ok()) return recipe.status();
  absl::StatusOr<double> baseline = TrainedEvalNe(WithoutLowPrecision(config), schema, exec, steps, batch, eval);
  if (!baseline.ok()) return baseline.status();
  c.recipe_ne = *recipe;
  c.baseline_ne = *baseline;
  return c;
}

}  // namespace recfleet::engine
