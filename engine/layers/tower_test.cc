#include "engine/layers/tower.h"

#include <cmath>
#include <vector>

#include "engine/layers/test_util.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {
namespace {

TEST(TowerTest, ForwardByHandAndBackward) {
  ParameterRegistry registry(DType::kFloat64, 1);
  Tower tower(Fp64Context(&registry), "ctr", 3, 2, Activation::kSilu);
  ASSERT_EQ(registry.all().size(), 4u);
  EXPECT_EQ(registry.all()[2]->name, "ctr.l2.w");
  EXPECT_EQ(registry.all()[2]->value.shape(), (Shape{1, 2}));
  // Zero l2 weight: every logit is l2's bias.
  ASSERT_TRUE(registry.Find("ctr.l2.w")->value.SetZero().ok());
  registry.Find("ctr.l2.b")->value.data<double>()[0] = 0.5;
  Tensor x = RandomTensor({3, 3}, 1), logits;
  ASSERT_TRUE(tower.Forward(x.view(), &logits).ok());
  EXPECT_EQ(Values(logits.view()), (std::vector<double>{0.5, 0.5, 0.5}));

  for (const Parameter* p : registry.all()) {
    Tensor t = RandomTensor(p->value.shape(), p->value.numel() + 3, 0.8);
    std::copy_n(t.data<double>(), t.numel(), p->value.data<double>());
  }
  Tensor w = RandomTensor({3}, 2);
  auto loss = [&] {
    EXPECT_TRUE(tower.Forward(x.view(), &logits).ok());
    return Dot(logits.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dx = TensorOf({3, 3}, std::vector<double>(9, 0));
  ASSERT_TRUE(tower.Backward(w.view(), dx.view(), true).ok());
  ExpectGradient(loss, x.view(), dx.view(), "x");
  ExpectParameterGradients(loss, registry);
}

TEST(BinaryCrossEntropyTest, MeanLossAndGradient) {
  ParameterRegistry registry(DType::kFloat64, 1);
  BinaryCrossEntropy bce(Fp64Context(&registry));
  // Logit 0 is probability 1/2: loss log 2 whatever the label, gradient
  // (1/2 - label) / batch.
  Tensor z = TensorOf({2, 1}, {0, 0}), dz;
  absl::StatusOr<double> loss = bce.Forward(z.view(), std::vector<float>{1, 0}, &dz);
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, std::log(2.0), 1e-15);
  EXPECT_EQ(Values(dz.view()), (std::vector<double>{-0.25, 0.25}));

  Tensor logits = TensorOf({3}, {-2, 0.5, 3});
  const std::vector<float> labels = {1, 0, 1};
  ASSERT_TRUE(bce.Forward(logits.view(), labels, &dz).ok());
  Tensor analytic = TensorOf({3}, Values(dz.view()));
  ExpectGradient([&] { return *bce.Forward(logits.view(), labels, nullptr); }, logits.view(),
                 analytic.view(), "logits");
  EXPECT_EQ(bce.Forward(logits.view(), std::vector<float>{1, 0}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::engine::layers
