#include "engine/quality_gate.h"

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "engine/metrics.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

NeComparison Comparison(double recipe_ne, double baseline_ne, int steps, int64_t eval_samples) {
  NeComparison c;
  c.recipe_ne = recipe_ne;
  c.baseline_ne = baseline_ne;
  c.steps = steps;
  c.eval_samples = eval_samples;
  return c;
}

TEST(QualityGateTest, PassesWithinTheToleranceAndRefusesNamingBothNes) {
  NeComparison c = Comparison(0.8008, 0.8, 200, 4096);
  EXPECT_NEAR(c.relative_increase(), 0.001, 1e-12);
  EXPECT_TRUE(CheckNeGate(c, 0.0011).ok());
  const absl::Status refused = CheckNeGate(c, 0.0005);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("0.80080 (recipe) vs 0.80000 (bf16): +0.100%"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("+0.05%"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("model.precision.quality_gate"), std::string::npos);
  c.recipe_ne = 0.7;  // Better than bf16: always passes.
  EXPECT_TRUE(CheckNeGate(c, 1e-9).ok());
  c.baseline_ne = 0;
  EXPECT_EQ(CheckNeGate(c, 0.1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(QualityGateTest, RefusesAToleranceItsEvalNoiseCannotResolve) {
  NeComparison c = Comparison(0.8, 0.8, 50, 400);
  c.relative_se = 0.004;  // 0.4%, against a tolerance of 0.1%.
  const absl::Status refused = CheckNeGate(c, 0.001);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("cannot resolve a tolerance of +0.1%"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("+- 0.400% (s.e. over the eval samples)"), std::string::npos) << refused.message();
  // (0.4% / 0.05%)^2 = 64 times the samples.
  EXPECT_NE(refused.message().find("about 25600"), std::string::npos) << refused.message();
  c.relative_se = 0.0009;
  EXPECT_TRUE(CheckNeGate(c, 0.001).ok());
  c.relative_se = -1;  // Not measured: the point estimate alone decides.
  EXPECT_TRUE(CheckNeGate(c, 0.001).ok());
  EXPECT_EQ(c.Describe().find("s.e."), std::string::npos);
  // Over runs: the mean decides, and the runs' spread is noise the gate
  // holds against its tolerance.
  c.relative_se = 0.0002;
  c.run_increases = {0.0004, 0.0002, 0.0006};
  EXPECT_NEAR(c.relative_increase(), 0.0004, 1e-12);
  EXPECT_NEAR(c.run_se(), 0.0002 / std::sqrt(3.0), 1e-12);  // s.d. 0.0002 over 3 runs.
  EXPECT_NEAR(c.noise_se(), std::sqrt(0.0002 * 0.0002 + 0.0002 * 0.0002 / 3), 1e-12);
  EXPECT_TRUE(CheckNeGate(c, 0.001).ok());
  EXPECT_NE(c.Describe().find("; over 3 runs +0.040% +- 0.012% (s.e. over the runs: +0.040%, +0.020%, +0.060%)"),
            std::string::npos)
      << c.Describe();
  c.run_increases = {0.004, -0.004};  // Mean 0, but the runs disagree by 0.8%.
  const absl::Status spread = CheckNeGate(c, 0.001);
  EXPECT_EQ(spread.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(spread.message().find("the runs differ by more than the tolerance"), std::string::npos)
      << spread.message();
  // Each standard error within the tolerance, together above it.
  c.relative_se = 0.0008;
  c.run_increases = {0.0008, -0.0008};  // run s.e. 0.08%.
  EXPECT_NE(CheckNeGate(c, 0.001).message().find("together exceed the tolerance"), std::string::npos);
  c.run_increases = {0.0003};  // One run: no run s.e.
  EXPECT_EQ(c.run_se(), -1);
  EXPECT_DOUBLE_EQ(c.relative_increase(), 0.0);
  c.run_increases.clear();
  // Above the tolerance it fails as before, whatever the noise.
  c.recipe_ne = 0.81;
  c.relative_se = 0.004;
  EXPECT_NE(CheckNeGate(c, 0.001).message().find("fails its gate"), std::string::npos);
}

// Logits of a model whose per-sample log loss (label 1) is `loss`.
double LogitForLoss(double loss) { return -std::log(std::expm1(loss)); }

TEST(QualityGateTest, PairedStandardErrorIsZeroWhereTheLossesAreProportional) {
  std::vector<double> base = {0.3, -1.2, 2.0, 0.7, -0.1}, labels(base.size(), 1.0), recipe;
  for (double z : base) recipe.push_back(LogitForLoss(1.02 * std::log1p(std::exp(-z))));
  absl::StatusOr<double> se = PairedRelativeSe(recipe, base, labels);
  ASSERT_TRUE(se.ok()) << se.status();
  EXPECT_NEAR(*se, 0.0, 1e-12);  // Every sample says +2%: nothing to vary.
  EXPECT_NEAR(*PairedRelativeSe(base, base, labels), 0.0, 0.0);
  EXPECT_FALSE(PairedRelativeSe(recipe, base, {1.0}).ok());
  EXPECT_FALSE(PairedRelativeSe({0.0}, {0.0}, {1.0}).ok());
}

// The standard error predicts the spread of the relative increase over
// independent eval sets drawn from one population of (baseline, recipe,
// label) triples: two correlated models, the recipe slightly worse.
TEST(QualityGateTest, PairedStandardErrorMatchesTheSpreadOverEvalDraws) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  auto draw = [&](int n, std::vector<double>* base, std::vector<double>* recipe, std::vector<double>* labels) {
    base->clear();
    recipe->clear();
    labels->clear();
    for (int i = 0; i < n; ++i) {
      const double truth = 1.5 * normal(rng) - 1.0;
      labels->push_back(uniform(rng) < 1 / (1 + std::exp(-truth)) ? 1.0 : 0.0);
      const double zb = truth + 0.5 * normal(rng);
      base->push_back(zb);
      recipe->push_back(zb + 0.1 * normal(rng) + 0.01);
    }
  };
  constexpr int kDraws = 400, kSamples = 2000;
  std::vector<double> base, recipe, labels, increases;
  double mean_se = 0;
  for (int d = 0; d < kDraws; ++d) {
    draw(kSamples, &base, &recipe, &labels);
    double lr = 0, lb = 0;
    for (int i = 0; i < kSamples; ++i) {
      const double zr = recipe[i], zb = base[i], y = labels[i];
      lr += LogLoss(zr, y);
      lb += LogLoss(zb, y);
    }
    increases.push_back(lr / lb - 1);
    absl::StatusOr<double> se = PairedRelativeSe(recipe, base, labels);
    ASSERT_TRUE(se.ok()) << se.status();
    mean_se += *se / kDraws;
  }
  const double mean = std::accumulate(increases.begin(), increases.end(), 0.0) / kDraws;
  double var = 0;
  for (double x : increases) var += (x - mean) * (x - mean) / (kDraws - 1);
  // The spread of a standard deviation over 400 draws is ~3.5%.
  std::printf("mean s.e. %.3e, spread over draws %.3e\n", mean_se, std::sqrt(var));
  EXPECT_NEAR(mean_se / std::sqrt(var), 1.0, 0.12) << "mean s.e. " << mean_se << ", spread " << std::sqrt(var);
  EXPECT_GT(mean_se, 0.0);
}

TEST(QualityGateTest, BaselineDropsTheWholeRecipe) {
  GemLiteConfig c;
  c.fp8.modules = {"dcn", "towers"};
  c.fp8.fp8_weight_gradients = true;
  c.fp8.fp8_all_gather = true;
  c.fp8.attention = {"sequence", "pma"};
  const GemLiteConfig b = WithoutLowPrecision(c);
  EXPECT_TRUE(b.fp8.empty());
  EXPECT_TRUE(b.fp8.attention.empty());
  EXPECT_EQ(SequenceAttentionOptions(b).forward_precision, attention::ForwardPrecision::kBf16);
  EXPECT_FALSE(b.fp8.fp8_weight_gradients);
  EXPECT_FALSE(b.fp8.fp8_all_gather);
  EXPECT_EQ(b.dim, c.dim);
  EXPECT_EQ(b.seed, c.seed);
}

// The shadow run on the CPU engine: no recipe, so both models train the
// same steps identically and the gate sees exactly 0; the NE is that of a
// model that learned (below 1, the NE of predicting the base rate).
TEST(QualityGateTest, ShadowRunTrainsBothModelsOnTheSameBatches) {
  SyntheticOptions s;
  s.num_users = 40;
  s.num_items = 60;
  s.min_events = 4;
  s.mean_extra_events = 10;
  const MovieLensCtr data = *MovieLensCtr::Create(SyntheticMovieLens(s), CtrOptions());
  GemLiteConfig config;
  config.dim = 8;
  config.heads = 2;
  config.dcn_layers = 1;
  config.num_experts = 2;
  config.expert_hidden = 8;
  config.expert_out = 6;
  config.tower_hidden = 4;
  std::vector<Batch> train;
  for (int64_t first = 0; first + 32 <= data.num_train(); first += 32) {
    std::vector<int64_t> idx(32);
    std::iota(idx.begin(), idx.end(), first);
    train.push_back(data.MakeBatch(false, idx));
  }
  std::vector<int64_t> all(data.num_eval());
  std::iota(all.begin(), all.end(), 0);
  const std::vector<Batch> eval = {data.MakeBatch(true, all)};
  const int steps = 3 * static_cast<int>(train.size());
  auto c = RunShadowComparison(config, data.schema(), ExecutionOptions(), steps,
                               [&](int step) -> absl::StatusOr<const Batch*> { return &train[step % train.size()]; }, eval);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, steps);
  EXPECT_EQ(c->eval_samples, data.num_eval());
  EXPECT_EQ(c->recipe_ne, c->baseline_ne);
  EXPECT_EQ(c->relative_se, 0.0);
  EXPECT_TRUE(c->run_increases.empty());
  EXPECT_LT(c->baseline_ne, 1.0);
  EXPECT_TRUE(CheckNeGate(*c, 1e-9).ok());
  // Under the job's checkpointing with FP8-saved activations, the recipe
  // model keeps its recomputing blocks' inputs in FP8 and the baseline does
  // not: the baseline recomputes exactly (the same NE as stored), the
  // recipe's backward reads rounded inputs.
  ExecutionOptions checkpointed;
  checkpointed.attention_checkpoint.assign(config.seq_layers, layers::BlockCheckpoint::kBlock);
  checkpointed.fp8_saved_activations = true;
  EXPECT_FALSE(WithoutLowPrecision(checkpointed).fp8_saved_activations);
  EXPECT_EQ(WithoutLowPrecision(checkpointed).attention_checkpoint, checkpointed.attention_checkpoint);
  auto k = RunShadowComparison(config, data.schema(), checkpointed, steps,
                               [&](int step) -> absl::StatusOr<const Batch*> { return &train[step % train.size()]; }, eval);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->baseline_ne, c->baseline_ne);
  EXPECT_NE(k->recipe_ne, k->baseline_ne);
  // The CPU engine emulates an FP8 recipe (the reference kernels), so the
  // comparison runs in CI too: the towers' first layer (16 -> 16) trains in
  // FP8, the baseline's does not, and one step apart shows in the NE.
  GemLiteConfig fp8 = config;
  fp8.expert_out = 16;
  fp8.tower_hidden = 16;
  fp8.fp8.modules = {"towers"};
  fp8.fp8.fp8_weight_gradients = true;
  auto f = RunShadowComparison(fp8, data.schema(), ExecutionOptions(), 1,
                               [&](int) -> absl::StatusOr<const Batch*> { return &train[0]; }, eval);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->steps, 1);
  EXPECT_NE(f->recipe_ne, f->baseline_ne);
  EXPECT_GT(f->relative_se, 0.0);
  // Three runs: the CPU engine is deterministic, so every run repeats the
  // first exactly and the runs' standard error is 0.
  auto r = RunShadowComparison(fp8, data.schema(), ExecutionOptions(), 1,
                               [&](int) -> absl::StatusOr<const Batch*> { return &train[0]; }, eval, /*runs=*/3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->run_increases.size(), 3u);
  EXPECT_EQ(r->recipe_ne, f->recipe_ne);
  EXPECT_EQ(r->baseline_ne, f->baseline_ne);
  for (double x : r->run_increases) EXPECT_EQ(x, r->run_increases[0]);
  EXPECT_NEAR(r->run_se(), 0.0, 1e-15);  // The mean rounds.
  EXPECT_DOUBLE_EQ(r->relative_increase(), f->relative_increase());
}

}  // namespace
}  // namespace recfleet::engine
