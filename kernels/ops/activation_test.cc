#include "kernels/ops/activation.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

std::vector<double> RandomInputs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> x(n);
  for (double& v : x) v = normal(rng);
  return x;
}

double Scalar(Activation act, double x) {
  double y = 0;
  EXPECT_TRUE(ActivationForward(act, MakeView(&x, DType::kFloat64, {1}),
                                MakeView(&y, DType::kFloat64, {1}))
                  .ok());
  return y;
}

TEST(ActivationTest, KnownValues) {
  EXPECT_DOUBLE_EQ(Scalar(Activation::kRelu, -1.5), 0.0);
  EXPECT_DOUBLE_EQ(Scalar(Activation::kRelu, 2.5), 2.5);
  EXPECT_NEAR(Scalar(Activation::kSilu, 1.0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(Scalar(Activation::kSilu, -800.0), 0.0, 1e-300);
  // GELU(1) = Phi(1) = 0.841344746...
  EXPECT_NEAR(Scalar(Activation::kGelu, 1.0), 0.8413447460685429, 1e-12);
  EXPECT_NEAR(Scalar(Activation::kGelu, -10.0), 0.0, 1e-12);
}

// Central finite differences in float64 against the analytic backward.
TEST(ActivationTest, GradientMatchesFiniteDifferences) {
  for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
    std::vector<double> x = RandomInputs(64, 7);
    std::vector<double> dy = RandomInputs(64, 8);
    std::vector<double> dx(64);
    ASSERT_TRUE(ActivationBackward(act, MakeView(x.data(), DType::kFloat64, {8, 8}),
                                   MakeView(dy.data(), DType::kFloat64, {8, 8}),
                                   MakeView(dx.data(), DType::kFloat64, {8, 8}))
                    .ok());
    const double h = 1e-6;
    for (int i = 0; i < 64; ++i) {
      if (act == Activation::kRelu && std::abs(x[i]) < 1e-3) continue;  // kink
      const double numeric = (Scalar(act, x[i] + h) - Scalar(act, x[i] - h)) / (2 * h) * dy[i];
      EXPECT_NEAR(dx[i], numeric, 1e-7 * (1 + std::abs(numeric)))
          << ActivationName(act) << " at x=" << x[i];
    }
  }
}

TEST(ActivationTest, Float32MatchesFloat64) {
  std::vector<double> x = RandomInputs(100, 3);
  std::vector<float> xf(x.begin(), x.end()), yf(100);
  for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
    ASSERT_TRUE(ActivationForward(act, MakeView(xf.data(), DType::kFloat32, {100}),
                                  MakeView(yf.data(), DType::kFloat32, {100}))
                    .ok());
    for (int i = 0; i < 100; ++i) {
      EXPECT_NEAR(yf[i], Scalar(act, static_cast<double>(xf[i])), 1e-5);
    }
  }
}

TEST(ActivationTest, RejectsMismatchedShapesAndNames) {
  std::vector<float> a(6), b(4);
  absl::Status s = ActivationForward(Activation::kGelu, MakeView(a.data(), DType::kFloat32, {6}),
                                     MakeView(b.data(), DType::kFloat32, {4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("y must be fp32[6]"), std::string::npos) << s.message();
  std::vector<int32_t> ints(6);
  EXPECT_FALSE(ActivationForward(Activation::kRelu, MakeView(ints.data(), DType::kInt32, {6}),
                                 MakeView(ints.data(), DType::kInt32, {6}))
                   .ok());
  EXPECT_EQ(*ParseActivation("silu"), Activation::kSilu);
  EXPECT_FALSE(ParseActivation("tanh").ok());
}

}  // namespace
}  // namespace recfleet
