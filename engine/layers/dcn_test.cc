#include "engine/layers/dcn.h"

#include <vector>

#include "engine/layers/test_util.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {
namespace {

TEST(DcnTest, ForwardByHand) {
  ParameterRegistry registry(DType::kFloat64, 1);
  Dcn dcn(Fp64Context(&registry), "dcn", 1, 3);
  ASSERT_EQ(registry.all().size(), 2u);
  EXPECT_EQ(registry.all()[0]->name, "dcn0.w");
  // W = 0, b = 1: x1 = x0 * 1 + x0.
  ASSERT_TRUE(registry.all()[0]->value.SetZero().ok());
  std::fill_n(registry.all()[1]->value.data<double>(), 3, 1.0);
  Tensor x0 = TensorOf({2, 3}, {1, 2, 3, -1, 0, 5}), y;
  ASSERT_TRUE(dcn.Forward(x0.view(), &y).ok());
  EXPECT_EQ(Values(y.view()), (std::vector<double>{2, 4, 6, -2, 0, 10}));

  ParameterRegistry none(DType::kFloat64, 1);
  Dcn identity(Fp64Context(&none), "dcn", 0, 3);
  ASSERT_TRUE(identity.Forward(x0.view(), &y).ok());
  EXPECT_EQ(Values(y.view()), Values(x0.view()));
  Tensor dx0 = RandomTensor({2, 3}, 1);
  ASSERT_TRUE(identity.Backward(y.view(), dx0.view()).ok());
  EXPECT_EQ(Values(dx0.view()), Values(x0.view()));
}

TEST(DcnTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  Dcn dcn(Fp64Context(&registry), "dcn", 3, 4);
  for (const Parameter* p : registry.all()) {  // Non-zero biases too.
    Tensor t = RandomTensor(p->value.shape(), p->value.numel(), 0.5);
    std::copy_n(t.data<double>(), t.numel(), p->value.data<double>());
  }
  Tensor x0 = RandomTensor({3, 4}, 1), w = RandomTensor({3, 4}, 2), y;
  auto loss = [&] {
    EXPECT_TRUE(dcn.Forward(x0.view(), &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dx0 = RandomTensor({3, 4}, 3);  // Overwritten.
  ASSERT_TRUE(dcn.Backward(w.view(), dx0.view()).ok());
  ExpectGradient(loss, x0.view(), dx0.view(), "x0");
  ExpectParameterGradients(loss, registry);
}

}  // namespace
}  // namespace recfleet::engine::layers
