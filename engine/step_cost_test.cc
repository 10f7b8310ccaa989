#include "engine/step_cost.h"

#include <cstdint>
#include <random>
#include <vector>

#include "engine/calibrate.h"
#include "engine/model.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

JobModel SmallModel(attention::Mask mask, bool cross, int pma, int num_dense) {
  JobModel m;
  m.schema.tables = {{"item", 50}, {"action", 4}, {"user", 30}};
  m.schema.id_lists = {{"user", 2, Pooling::kSum}, {"cand", 0, Pooling::kSum}};
  m.schema.sequence_fields = {{"hist_item", 0}, {"hist_action", 1}};
  m.schema.num_dense = num_dense;
  m.config.dim = 16;
  m.config.heads = 2;
  m.config.seq_layers = 2;
  m.config.seq_mask = mask;
  m.config.seq_window = 5;
  m.config.cross_attention = cross;
  m.config.pma_queries = pma;
  m.config.dcn_layers = 2;
  m.config.num_experts = 3;
  m.config.expert_hidden = 24;
  m.config.expert_out = 12;
  m.config.tower_hidden = 8;
  m.ctr_label = "click";
  m.cvr_label = "conversion";
  return m;
}

// The engine's own FlopCounter (what worker MFU divides) and parameter
// count are the reference: the counts must match them exactly, for every
// mask, with and without the cross branch, PMA and numeric features, on
// ragged lengths that straddle the block size and the window.
TEST(StepCostTest, MatchesTheEnginesFlopCounterAndParameters) {
  struct Case {
    attention::Mask mask;
    bool cross;
    int pma, num_dense;
  };
  const Case cases[] = {{attention::Mask::kNone, true, 2, 4},
                        {attention::Mask::kSlidingWindow, false, 0, 0},
                        {attention::Mask::kBlock, true, 0, 3},
                        {attention::Mask::kCausal, false, 3, 1}};
  std::mt19937_64 rng(7);
  for (const Case& c : cases) {
    const JobModel m = SmallModel(c.mask, c.cross, c.pma, c.num_dense);
    std::vector<int64_t> lengths = {0, 1, 63, 64, 65, 130};
    for (int i = 0; i < 5; ++i) lengths.push_back(1 + static_cast<int64_t>(rng() % 90));
    auto gem = GemLite<float>::Create(m.config, m.schema);
    ASSERT_TRUE(gem.ok()) << gem.status();
    auto step = (*gem)->ForwardBackward(SyntheticBatch(m, lengths, 3));
    ASSERT_TRUE(step.ok()) << step.status();
    const StepCounts n = CountStep(m, lengths);
    EXPECT_NEAR(n.StepFlops(), step->flops, 1e-9 * step->flops) << static_cast<int>(c.mask);
    EXPECT_EQ(n.DenseParams(), (*gem)->num_dense_parameters()) << static_cast<int>(c.mask);
    EXPECT_EQ(n.samples, static_cast<int64_t>(lengths.size()));
    EXPECT_EQ(n.table_rows, 84);
  }
}

TEST(StepCostTest, TokenWorkScalesWithLengthAndAttentionWithItsSquare) {
  const JobModel m = SmallModel(attention::Mask::kNone, false, 0, 0);
  const StepCounts a = CountStep(m, std::vector<int64_t>(4, 10));
  const StepCounts b = CountStep(m, std::vector<int64_t>(4, 20));
  EXPECT_EQ(b.tokens, 2 * a.tokens);
  EXPECT_DOUBLE_EQ(b.token_elements, 2 * a.token_elements);
  EXPECT_DOUBLE_EQ(b.AttentionFlops(), 4 * a.AttentionFlops());
  EXPECT_DOUBLE_EQ(b.dense_elements, a.dense_elements);  // Per sample only.
}

}  // namespace
}  // namespace recfleet::engine
