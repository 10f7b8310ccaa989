#include "engine/quality_gate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/metrics.h"

namespace recfleet::engine {

std::string NeComparison::Describe() const {
  const std::string se =
      relative_se < 0 ? "" : absl::StrFormat(" +- %.3f%% (s.e. over the eval samples)", 100 * relative_se);
  std::string runs;
  if (run_increases.size() >= 2) {
    std::vector<std::string> each;
    for (double x : run_increases) each.push_back(absl::StrFormat("%+.3f%%", 100 * x));
    runs = absl::StrFormat("; over %d runs %+.3f%% +- %.3f%% (s.e. over the runs: %s)",
                           static_cast<int>(run_increases.size()), 100 * relative_increase(), 100 * run_se(),
                           absl::StrJoin(each, ", "));
  }
  return absl::StrFormat("eval NE %.5f (recipe) vs %.5f (bf16): %+.3f%%%s after %d steps, %lld samples%s", recipe_ne,
                         baseline_ne, 100 * (recipe_ne - baseline_ne) / baseline_ne, se, steps,
                         static_cast<long long>(eval_samples), runs);
}

double NeComparison::relative_increase() const {
  if (run_increases.size() < 2) return (recipe_ne - baseline_ne) / baseline_ne;
  double sum = 0;
  for (double x : run_increases) sum += x;
  return sum / static_cast<double>(run_increases.size());
}

double NeComparison::run_se() const {
  const size_t n = run_increases.size();
  if (n < 2) return -1;
  const double mean = relative_increase();
  double ss = 0;
  for (double x : run_increases) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
}

double NeComparison::noise_se() const {
  if (relative_se < 0 && run_se() < 0) return -1;
  const double eval = std::max(relative_se, 0.0), run = std::max(run_se(), 0.0);
  return std::sqrt(eval * eval + run * run);
}

namespace {

struct Scores {
  std::vector<double> logits, labels;
};

// A fresh model of `config` trained `steps` steps, then its CTR logits on
// `eval`.
absl::StatusOr<Scores> TrainAndScore(const GemLiteConfig& config, const FeatureSchema& schema,
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
  Scores out;
  for (const Batch& b : eval) {
    absl::StatusOr<std::vector<double>> z = (*model)->Predict(b, Head::kCtr);
    if (!z.ok()) return z.status();
    out.logits.insert(out.logits.end(), z->begin(), z->end());
    out.labels.insert(out.labels.end(), b.ctr_labels.begin(), b.ctr_labels.end());
  }
  return out;
}

absl::StatusOr<double> Ne(const Scores& s) {
  absl::StatusOr<BinaryMetrics> metrics = ComputeBinaryMetrics(s.logits, s.labels);
  if (!metrics.ok()) return metrics.status();
  return metrics->normalized_entropy;
}

}  // namespace

absl::StatusOr<double> PairedRelativeSe(const std::vector<double>& recipe, const std::vector<double>& baseline,
                                        const std::vector<double>& labels) {
  const size_t n = labels.size();
  if (recipe.size() != n || baseline.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("PairedRelativeSe: ", recipe.size(), " recipe and ",
                                                   baseline.size(), " baseline logits for ", n, " labels"));
  }
  if (n < 2) return absl::InvalidArgumentError("PairedRelativeSe: needs two samples or more");
  std::vector<double> lb(n), d(n);
  double sum_b = 0, sum_d = 0;
  for (size_t i = 0; i < n; ++i) {
    lb[i] = LogLoss(baseline[i], labels[i]);
    d[i] = LogLoss(recipe[i], labels[i]) - lb[i];
    sum_b += lb[i];
    sum_d += d[i];
  }
  if (!(sum_b > 0)) return absl::InvalidArgumentError("PairedRelativeSe: the baseline's log loss is 0");
  const double ratio = sum_d / sum_b;
  double sum_e2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = d[i] - ratio * lb[i];
    sum_e2 += e * e;
  }
  return std::sqrt(sum_e2 / (static_cast<double>(n) * (n - 1))) / (sum_b / n);
}

GemLiteConfig WithoutLowPrecision(GemLiteConfig config) {
  config.fp8 = Fp8Recipe();
  return config;
}

ExecutionOptions WithoutLowPrecision(ExecutionOptions exec) {
  exec.fp8_saved_activations = false;
  return exec;
}

absl::Status CheckNeGate(const NeComparison& comparison, double max_relative_increase) {
  if (!(comparison.baseline_ne > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.precision.quality_gate: the bf16 shadow model's eval NE is ", comparison.baseline_ne,
        ", so no relative tolerance applies (an eval set of one label?)"));
  }
  if (comparison.relative_increase() > max_relative_increase) {
    return absl::FailedPreconditionError(absl::StrFormat(
      "model.precision.quality_gate: the low-precision recipe fails its gate: %s, above the tolerance of +%g%%; "
      "name fewer fp8_modules (keep late layers bf16) or fp8_attention blocks, keep weight_gradient BF16, or raise "
      "max_relative_ne_increase",
      comparison.Describe(), 100 * max_relative_increase));
  }
  if (!(comparison.noise_se() > max_relative_increase)) return absl::OkStatus();
  // Which noise to shrink: the runs' spread, the eval samples' (with the
  // samples for an s.e. of half the tolerance: it falls as 1 / sqrt(n)), or
  // both together.
  std::string why;
  if (comparison.run_se() > max_relative_increase) {
    why = "the runs differ by more than the tolerance (the training's own noise), so the gate would pass or fail by "
          "chance. Raise shadow_steps (short runs diverge most), runs, or max_relative_ne_increase";
  } else if (comparison.relative_se > max_relative_increase) {
    const double ratio = comparison.relative_se / (0.5 * max_relative_increase);
    why = absl::StrFormat(
        "the standard error over the eval samples alone exceeds the tolerance, so the gate would pass or fail by "
        "chance. Raise eval_samples (about %.0f would bring it to half the tolerance; the eval set must hold that "
        "many) or max_relative_ne_increase",
        std::ceil(static_cast<double>(comparison.eval_samples) * ratio * ratio));
  } else {
    why = "the standard errors over the eval samples and over the runs together exceed the tolerance, so the gate "
          "would pass or fail by chance. Raise eval_samples, shadow_steps or runs, or max_relative_ne_increase";
  }
  return absl::FailedPreconditionError(absl::StrFormat("model.precision.quality_gate: cannot resolve a tolerance of "
                                                       "+%g%%: %s; %s",
                                                       100 * max_relative_increase, comparison.Describe(), why));
}

absl::StatusOr<double> TrainedEvalNe(const GemLiteConfig& config, const FeatureSchema& schema,
                                     const ExecutionOptions& exec, int steps,
                                     const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                     const std::vector<Batch>& eval) {
  absl::StatusOr<Scores> scores = TrainAndScore(config, schema, exec, steps, batch, eval);
  if (!scores.ok()) return scores.status();
  return Ne(*scores);
}

absl::StatusOr<NeComparison> RunShadowComparison(const GemLiteConfig& config, const FeatureSchema& schema,
                                                 const ExecutionOptions& exec, int steps,
                                                 const std::function<absl::StatusOr<const Batch*>(int step)>& batch,
                                                 const std::vector<Batch>& eval, int runs) {
  NeComparison c;
  c.steps = steps;
  for (const Batch& b : eval) c.eval_samples += b.size;
  for (int run = 0; run < std::max(runs, 1); ++run) {
    absl::StatusOr<Scores> recipe = TrainAndScore(config, schema, exec, steps, batch, eval);
    if (!recipe.ok()) return recipe.status();
    absl::StatusOr<double> recipe_ne = Ne(*recipe);
    if (!recipe_ne.ok()) return recipe_ne.status();
    absl::StatusOr<Scores> baseline =
        TrainAndScore(WithoutLowPrecision(config), schema, WithoutLowPrecision(exec), steps, batch, eval);
    if (!baseline.ok()) return baseline.status();
    absl::StatusOr<double> baseline_ne = Ne(*baseline);
    if (!baseline_ne.ok()) return baseline_ne.status();
    if (run == 0) {
      c.recipe_ne = *recipe_ne;
      c.baseline_ne = *baseline_ne;
      absl::StatusOr<double> se = PairedRelativeSe(recipe->logits, baseline->logits, baseline->labels);
      if (se.ok()) c.relative_se = *se;  // Else (one eval sample) not measured.
    }
    if (runs >= 2) c.run_increases.push_back((*recipe_ne - *baseline_ne) / *baseline_ne);
  }
  return c;
}

}  // namespace recfleet::engine
