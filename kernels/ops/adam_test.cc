#include "kernels/ops/adam.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

// An independent scalar transcription of the update (PyTorch's Adam/AdamW).
void ReferenceStep(const AdamConfig& c, int t, double& p, double g, double& m, double& v) {
  if (c.decoupled_weight_decay) {
    p *= 1 - c.lr * c.weight_decay;
  } else {
    g += c.weight_decay * p;
  }
  m = c.beta1 * m + (1 - c.beta1) * g;
  v = c.beta2 * v + (1 - c.beta2) * g * g;
  const double mhat = m / (1 - std::pow(c.beta1, t));
  const double vhat = v / (1 - std::pow(c.beta2, t));
  p -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
}

TEST(AdamTest, MatchesReferenceOverSeveralSteps) {
  for (bool decoupled : {true, false}) {
    AdamConfig c;
    c.lr = 0.05;
    c.weight_decay = 0.1;
    c.decoupled_weight_decay = decoupled;
    std::vector<double> p = {1.0, -2.0, 0.5}, m(3), v(3);
    std::vector<double> rp = p, rm(3), rv(3);
    for (int t = 1; t <= 5; ++t) {
      std::vector<double> g = {0.3 * t, -1.0, 0.01 / t};
      ASSERT_TRUE(AdamStep(c, t, MakeView(p.data(), DType::kFloat64, {3}),
                           MakeView(g.data(), DType::kFloat64, {3}),
                           MakeView(m.data(), DType::kFloat64, {3}),
                           MakeView(v.data(), DType::kFloat64, {3}))
                      .ok());
      for (int i = 0; i < 3; ++i) ReferenceStep(c, t, rp[i], g[i], rm[i], rv[i]);
    }
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], rp[i], 1e-12) << i;
  }
}

TEST(AdamTest, FirstStepMovesEachWeightByLrAgainstTheGradientSign) {
  AdamConfig c;
  c.lr = 0.01;
  std::vector<float> p = {0.0f, 0.0f}, g = {5.0f, -1e-3f}, m(2), v(2);
  ASSERT_TRUE(AdamStep(c, 1, MakeView(p.data(), DType::kFloat32, {2}),
                       MakeView(g.data(), DType::kFloat32, {2}),
                       MakeView(m.data(), DType::kFloat32, {2}),
                       MakeView(v.data(), DType::kFloat32, {2}))
                  .ok());
  EXPECT_NEAR(p[0], -0.01f, 1e-6f);
  EXPECT_NEAR(p[1], 0.01f, 1e-4f);
}

TEST(AdamTest, RejectsBadStepAndConfig) {
  std::vector<float> p(2), g(2), m(2), v(2);
  auto view = [](std::vector<float>& x) { return MakeView(x.data(), DType::kFloat32, {2}); };
  EXPECT_FALSE(AdamStep(AdamConfig(), 0, view(p), view(g), view(m), view(v)).ok());
  AdamConfig bad;
  bad.beta1 = 1.0;
  EXPECT_FALSE(AdamStep(bad, 1, view(p), view(g), view(m), view(v)).ok());
  std::vector<float> small(1);
  EXPECT_FALSE(AdamStep(AdamConfig(), 1, view(p), view(g), view(m),
                        MakeView(small.data(), DType::kFloat32, {1}))
                   .ok());
}

}  // namespace
}  // namespace recfleet
