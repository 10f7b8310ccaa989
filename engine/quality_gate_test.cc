#include "engine/quality_gate.h"

#include <numeric>
#include <vector>

#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

TEST(QualityGateTest, PassesWithinTheToleranceAndRefusesNamingBothNes) {
  NeComparison c;
  c.recipe_ne = 0.8008;
  c.baseline_ne = 0.8;
  c.steps = 200;
  c.eval_samples = 4096;
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
  EXPECT_LT(c->baseline_ne, 1.0);
  EXPECT_TRUE(CheckNeGate(*c, 1e-9).ok());
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
}

}  // namespace
}  // namespace recfleet::engine
