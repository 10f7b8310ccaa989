#include "kernels/ops/bce.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

double Loss(double z, double y) {
  double loss = 0;
  EXPECT_TRUE(BceWithLogitsForward(MakeView(&z, DType::kFloat64, {1}),
                                   MakeView(&y, DType::kFloat64, {1}),
                                   MakeView(&loss, DType::kFloat64, {1}))
                  .ok());
  return loss;
}

TEST(BceTest, MatchesDefinitionAndStaysFiniteAtExtremes) {
  for (double z : {-3.0, -0.2, 0.0, 1.7}) {
    for (double y : {0.0, 0.3, 1.0}) {
      const double p = 1.0 / (1.0 + std::exp(-z));
      EXPECT_NEAR(Loss(z, y), -(y * std::log(p) + (1 - y) * std::log(1 - p)), 1e-12);
    }
  }
  EXPECT_NEAR(Loss(1000.0, 0.0), 1000.0, 1e-9);
  EXPECT_NEAR(Loss(-1000.0, 1.0), 1000.0, 1e-9);
  EXPECT_NEAR(Loss(1000.0, 1.0), 0.0, 1e-12);
}

TEST(BceTest, GradientMatchesFiniteDifferences) {
  std::vector<double> z = {-4.0, -0.5, 0.0, 0.3, 2.5, 9.0};
  std::vector<double> y = {0.0, 1.0, 1.0, 0.0, 0.5, 1.0};
  std::vector<double> dloss = {1.0, -2.0, 0.5, 3.0, 1.0, 0.25};
  std::vector<double> dz(6);
  ASSERT_TRUE(BceWithLogitsBackward(MakeView(z.data(), DType::kFloat64, {6}),
                                    MakeView(y.data(), DType::kFloat64, {6}),
                                    MakeView(dloss.data(), DType::kFloat64, {6}),
                                    MakeView(dz.data(), DType::kFloat64, {6}))
                  .ok());
  const double h = 1e-6;
  for (int i = 0; i < 6; ++i) {
    const double numeric = (Loss(z[i] + h, y[i]) - Loss(z[i] - h, y[i])) / (2 * h) * dloss[i];
    EXPECT_NEAR(dz[i], numeric, 1e-8) << i;
  }
}

TEST(BceTest, RejectsLabelShapeMismatch) {
  std::vector<float> z(4), y(3), loss(4);
  absl::Status s = BceWithLogitsForward(MakeView(z.data(), DType::kFloat32, {4}),
                                        MakeView(y.data(), DType::kFloat32, {3}),
                                        MakeView(loss.data(), DType::kFloat32, {4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("labels"), std::string::npos);
}

}  // namespace
}  // namespace recfleet
