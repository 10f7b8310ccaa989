#include "engine/metrics.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

// O(P*N) definition: fraction of (positive, negative) pairs ordered right.
double PairwiseAuc(const std::vector<double>& s, const std::vector<double>& y) {
  double good = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    for (size_t j = 0; j < s.size(); ++j) {
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        good += s[i] > s[j] ? 1.0 : (s[i] == s[j] ? 0.5 : 0.0);
      }
    }
  }
  return good / pairs;
}

TEST(MetricsTest, AucHandComputed) {
  EXPECT_DOUBLE_EQ(*Auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(*Auc({1, 2, 3}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(*Auc({3, 2, 1}, {0, 1, 1}), 0.0);
  // All tied: exactly one half.
  EXPECT_DOUBLE_EQ(*Auc({5, 5, 5, 5}, {0, 1, 0, 1}), 0.5);
}

TEST(MetricsTest, AucWithManyTiesMatchesPairwiseDefinition) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> score(0, 6);
  std::bernoulli_distribution label(0.4);
  std::vector<double> s(500), y(500);
  for (int i = 0; i < 500; ++i) {
    s[i] = score(rng);
    y[i] = label(rng) ? 1 : 0;
  }
  EXPECT_NEAR(*Auc(s, y), PairwiseAuc(s, y), 1e-12);
}

TEST(MetricsTest, LossAndNormalizedEntropy) {
  // A constant predictor at the base rate has NE exactly 1.
  const double p = 0.25;
  const double logit = std::log(p / (1 - p));
  BinaryMetrics m = *ComputeBinaryMetrics({logit, logit, logit, logit}, {1, 0, 0, 0});
  EXPECT_NEAR(m.normalized_entropy, 1.0, 1e-12);
  EXPECT_NEAR(m.log_loss, -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-12);
  EXPECT_DOUBLE_EQ(m.positive_rate, 0.25);
  // Informative logits: NE below 1.
  BinaryMetrics good = *ComputeBinaryMetrics({3, -3, -3, -3}, {1, 0, 0, 0});
  EXPECT_LT(good.normalized_entropy, 0.2);
  EXPECT_DOUBLE_EQ(good.auc, 1.0);
}

TEST(MetricsTest, RejectsOneClassAndBadLabels) {
  EXPECT_FALSE(Auc({1, 2}, {1, 1}).ok());
  EXPECT_FALSE(Auc({1, 2}, {0, 2}).ok());
  EXPECT_FALSE(Auc({1, 2, 3}, {0, 1}).ok());
}

// A diverged model's NaN predictions are refused, not ranked: NaN compares
// unequal to itself, and the tie grouping used to loop on it for ever (an
// eval that never returned).
TEST(MetricsTest, NonFiniteScoresAreRefusedWithTheirCount) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  absl::StatusOr<double> a = Auc({0.5, nan, 0.2, nan}, {0, 1, 1, 0});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("2 of 4 scores are NaN"));
  EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("index 1"));
  EXPECT_FALSE(Auc({nan, nan}, {0, 1}).ok());
  EXPECT_FALSE(ComputeBinaryMetrics({0.1, nan, 0.3}, {0, 1, 1}).ok());
  // An infinite score still ranks, but no log loss is finite for it.
  EXPECT_DOUBLE_EQ(*Auc({-inf, 0.0, inf}, {0, 0, 1}), 1.0);
  absl::StatusOr<BinaryMetrics> m = ComputeBinaryMetrics({-inf, 0.0, 1.0}, {0, 0, 1});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("logits[0]"));
}

TEST(MetricsTest, CompareVectorsHandComputed) {
  const std::vector<float> ref = {3, 4, 0}, test = {3, 4, 1}, opposite = {-3, -4, 0};
  absl::StatusOr<VectorAgreement> a = CompareVectors(test, ref);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ(a->ref_norm, 5);
  EXPECT_DOUBLE_EQ(a->test_norm, std::sqrt(26.0));
  EXPECT_DOUBLE_EQ(a->cosine, 25 / (5 * std::sqrt(26.0)));
  EXPECT_DOUBLE_EQ(a->relative_error, 0.2);
  EXPECT_DOUBLE_EQ(CompareVectors(opposite, ref)->cosine, -1);
  EXPECT_DOUBLE_EQ(CompareVectors(opposite, ref)->relative_error, 2);
  // Zero vectors: equal when both are, infinitely far when only ref is.
  const std::vector<float> zero(3, 0.0f);
  EXPECT_EQ(CompareVectors(zero, zero)->cosine, 1);
  EXPECT_EQ(CompareVectors(zero, zero)->relative_error, 0);
  EXPECT_EQ(CompareVectors(ref, zero)->cosine, 0);
  EXPECT_TRUE(std::isinf(CompareVectors(ref, zero)->relative_error));
  EXPECT_EQ(CompareVectors(ref, {1.0f}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::engine
