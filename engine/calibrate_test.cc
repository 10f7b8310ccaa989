#include "engine/calibrate.h"

#include <random>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

constexpr char kTinySpec[] = R"pb(
  model {
    tables { name: "item" rows: 100 dim: 8 }
    tables { name: "user" rows: 20 dim: 8 }
    features { name: "user_id" kind: ID_LIST table: "user" }
    features { name: "item_id" kind: CANDIDATE table: "item" }
    features { name: "history_items" kind: SEQUENCE table: "item" }
    sequence { features: "history_items" num_layers: 1 model_dim: 8 num_heads: 2 attention { kind: FULL } }
    cross { num_cross_layers: 1 pma_queries: 2 num_heads: 2 }
    dense { mlp { hidden_dims: [ 16, 8 ] } }
    heads { kind: CTR label: "label" hidden_dims: 8 }
  }
  data { dataset: "unused" local_batch_size: 8 }
  resources { workers: 1 }
  training { steps: 1 dense_learning_rate: 0.01 sparse_learning_rate: 0.05 seed: 3 }
)pb";

JobModel Tiny() {
  v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kTinySpec, &spec));
  absl::StatusOr<JobModel> m = BuildJobModel(spec);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// The real engine times every batch, the fit sees the one-length and the
// mixed_fit batches only, and its weights are non-negative and predict.
TEST(CalibrateTest, TimesTheTinyModelAndHoldsBatchesOut) {
  CalibrationOptions o;
  o.lengths = {1, 8, 32, 64};
  o.batch_size = 4;
  o.repeats = 1;
  o.fit_batches = 2;
  o.check_batches = 3;
  auto c = Calibrate(Tiny(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->one_length.size(), 4u);
  for (size_t i = 0; i < c->one_length.size(); ++i) {
    EXPECT_EQ(c->one_length[i].lengths, std::vector<int64_t>(4, o.lengths[i]));
    EXPECT_GT(c->one_length[i].seconds, 0);
  }
  ASSERT_EQ(c->mixed_fit.size(), 2u);
  ASSERT_EQ(c->held_out.size(), 3u);
  for (const auto* set : {&c->mixed_fit, &c->held_out}) {
    for (const data::BatchTime& b : *set) {
      ASSERT_EQ(b.lengths.size(), 4u);
      for (int64_t l : b.lengths) {
        EXPECT_GE(l, 1);
        EXPECT_LE(l, 64);
      }
      EXPECT_GT(b.seconds, 0);
    }
  }
  EXPECT_NE(c->held_out[0].lengths, c->mixed_fit[0].lengths);
  EXPECT_GE(c->fit.per_sample, 0);
  EXPECT_GE(c->fit.linear, 0);
  EXPECT_GE(c->fit.quadratic, 0);
  EXPECT_GT(c->fit.SampleCost(64), 0);
  o.check_batches = -1;
  EXPECT_EQ(Calibrate(Tiny(), o).status().code(), absl::StatusCode::kInvalidArgument);
}

// The known cost the fitting tests plant in their times.
data::CostModel Planted() {
  data::CostModel planted;
  planted.per_sample = 2e-4;
  planted.linear = 3e-6;
  planted.quadratic = 4e-9;
  return planted;
}

// Batch times planted from a known cost (plus 1% noise) on batches of
// mixed lengths and sizes only: the fit recovers the planted weights.
// (Equal-sized batches drawn from one length range would not do: their
// sums of L and of L^2 move together, so noise trades one for the other.)
TEST(CalibrateTest, FitToMixedBatchesRecoversPlantedWeights) {
  const data::CostModel planted = Planted();
  std::mt19937_64 rng(2);
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<data::BatchTime> batches;
  for (int b = 0; b < 40; ++b) {
    data::BatchTime t;
    const int size = 1 + static_cast<int>(rng() % 32);
    const int64_t longest = 1 + static_cast<int64_t>(rng() % 512);
    for (int i = 0; i < size; ++i) {
      t.lengths.push_back(1 + static_cast<int64_t>(rng() % longest));
      t.seconds += planted.SampleCost(t.lengths.back());
    }
    t.seconds *= 1 + noise(rng);
    batches.push_back(t);
  }
  auto fit = data::FitCostModelToBatches(batches);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->per_sample, planted.per_sample, 0.1 * planted.per_sample);
  EXPECT_NEAR(fit->linear, planted.linear, 0.1 * planted.linear);
  EXPECT_NEAR(fit->quadratic, planted.quadratic, 0.1 * planted.quadratic);
  batches.push_back({{}, 1.0});  // An empty batch.
  EXPECT_FALSE(data::FitCostModelToBatches(batches).ok());
}

TEST(CalibrateTest, SyntheticBatchHasTheRequestedLengths) {
  const JobModel m = Tiny();
  Batch b = SyntheticBatch(m, {0, 3, 1}, 9);
  EXPECT_EQ(b.size, 3);
  ASSERT_EQ(b.sequence.size(), 1u);
  EXPECT_EQ(b.sequence[0].offsets, (std::vector<int64_t>{0, 0, 3, 4}));
  for (int64_t id : b.sequence[0].ids) EXPECT_LT(id, 100);
  EXPECT_EQ(b.ctr_labels, (std::vector<float>{0, 1, 0}));
}

// Times planted as a known per-sample + linear + quadratic cost (plus 1%
// noise) at the lengths the tiny model is timed at: the fit recovers the
// planted weights.
TEST(CalibrateTest, FitRecoversPlantedWeights) {
  const data::CostModel planted = Planted();
  std::mt19937_64 rng(1);
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<data::CostMeasurement> times;
  for (int rep = 0; rep < 5; ++rep) {
    for (int64_t l : CalibrationOptions().lengths) {
      times.push_back({l, planted.SampleCost(l) * (1 + noise(rng))});
    }
  }
  auto fit = data::FitCostModel(times);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->per_sample, planted.per_sample, 0.02 * planted.per_sample);
  EXPECT_NEAR(fit->linear, planted.linear, 0.1 * planted.linear);
  EXPECT_NEAR(fit->quadratic, planted.quadratic, 0.1 * planted.quadratic);
  // A negative best weight is left out rather than returned.
  times.clear();
  for (int64_t l : {1, 100, 200, 400}) times.push_back({l, 1e-3 + 1e-5 * l});
  fit = data::FitCostModel(times);
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->quadratic, 0);
  EXPECT_NEAR(fit->linear, 1e-5, 1e-9);
  EXPECT_FALSE(data::FitCostModel({{1, 1.0}, {2, 2.0}}).ok());  // Two lengths.
  EXPECT_FALSE(data::FitCostModel({{1, 1.0}, {2, 0.0}, {3, 1.0}}).ok());
}

}  // namespace
}  // namespace recfleet::engine
