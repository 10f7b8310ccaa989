#include "engine/layers/moe.h"

#include <cmath>
#include <vector>

#include "engine/layers/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {
namespace {

TEST(MixtureOfExpertsTest, ForwardByHand) {
  ParameterRegistry registry(DType::kFloat64, 1);
  MixtureOfExperts moe(Fp64Context(&registry), "moe", 3, 2, 4, 2, Activation::kRelu);
  std::vector<std::string> names;
  for (const Parameter* p : registry.all()) names.push_back(p->name);
  EXPECT_THAT(names, ::testing::ElementsAre("moe.gate.w", "moe.gate.b", "moe.expert0.l1.w",
                                            "moe.expert0.l1.b", "moe.expert0.l2.w",
                                            "moe.expert0.l2.b", "moe.expert1.l1.w",
                                            "moe.expert1.l1.b", "moe.expert1.l2.w",
                                            "moe.expert1.l2.b"));
  // Zero weights: each expert outputs relu(its l2 bias); the gate's bias
  // (0, log 3) weighs them 1/4 and 3/4.
  for (Parameter* p : registry.all()) ASSERT_TRUE(p->value.SetZero().ok());
  registry.Find("moe.gate.b")->value.data<double>()[1] = std::log(3.0);
  double* b0 = registry.Find("moe.expert0.l2.b")->value.data<double>();
  double* b1 = registry.Find("moe.expert1.l2.b")->value.data<double>();
  b0[0] = 1, b0[1] = 2, b1[0] = 3, b1[1] = -4;
  Tensor x = RandomTensor({2, 3}, 1), y;
  ASSERT_TRUE(moe.Forward(x.view(), &y).ok());
  const std::vector<double> expected = {0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 0};
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(y.data<double>()[s * 2 + 0], expected[0], 1e-14);
    EXPECT_NEAR(y.data<double>()[s * 2 + 1], expected[1], 1e-14);
  }
}

TEST(MixtureOfExpertsTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  MixtureOfExperts moe(Fp64Context(&registry), "moe", 5, 3, 4, 2, Activation::kGelu);
  for (const Parameter* p : registry.all()) {
    Tensor t = RandomTensor(p->value.shape(), p->value.numel() + 7, 0.7);
    std::copy_n(t.data<double>(), t.numel(), p->value.data<double>());
  }
  Tensor x = RandomTensor({4, 5}, 1), w = RandomTensor({4, 2}, 2), y;
  auto loss = [&] {
    EXPECT_TRUE(moe.Forward(x.view(), &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dx = RandomTensor({4, 5}, 3);  // Overwritten (accumulate = false).
  ASSERT_TRUE(moe.Backward(w.view(), dx.view(), false).ok());
  ExpectGradient(loss, x.view(), dx.view(), "x");
  ExpectParameterGradients(loss, registry);
}

}  // namespace
}  // namespace recfleet::engine::layers
