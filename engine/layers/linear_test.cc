#include "engine/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/layers/test_util.h"
#include "kernels/gemm/linear.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {
namespace {

using ::testing::ElementsAre;

TEST(LinearTest, ForwardByHandAndRegistration) {
  ParameterRegistry registry(DType::kFloat64, 1);
  FlopCounter flops;
  LayerContext ctx = Fp64Context(&registry);
  ctx.flops = &flops;
  Linear l(ctx, "proj", /*in=*/2, /*out=*/3, /*bias=*/true);
  ASSERT_EQ(registry.all().size(), 2u);
  EXPECT_EQ(registry.all()[0]->name, "proj.w");
  EXPECT_EQ(registry.all()[1]->name, "proj.b");
  EXPECT_THAT(Values(l.bias()->value.view()), ElementsAre(0, 0, 0));
  const std::vector<double> w = {1, 0, 0, 1, 1, -1};  // rows: [1 0], [0 1], [1 -1]
  std::copy(w.begin(), w.end(), l.weight().value.data<double>());
  l.bias()->value.data<double>()[2] = 10;
  Tensor x = TensorOf({2, 2}, {3, 4, 5, 7});
  Tensor y;
  ASSERT_TRUE(l.Forward(x.view(), &y).ok());
  EXPECT_THAT(Values(y.view()), ElementsAre(3, 4, 9, 5, 7, 8));
  EXPECT_EQ(flops.linear, 2.0 * 2 * 2 * 3);
}

TEST(LinearTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 2);
  Linear l(Fp64Context(&registry), "proj", 4, 3, true);
  Tensor x = RandomTensor({5, 4}, 3);
  Tensor w = RandomTensor({5, 3}, 4);  // Loss weights: loss = <w, y>.
  Tensor y;
  auto loss = [&] {
    EXPECT_TRUE(l.Forward(x.view(), &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dx = TensorOf({5, 4}, std::vector<double>(20, 0));
  ASSERT_TRUE(l.Backward(w.view(), dx.view(), false).ok());
  ExpectGradient(loss, x.view(), dx.view(), "x");
  ExpectParameterGradients(loss, registry);

  // accumulate adds dy W to what is there; overwrite replaces it.
  Tensor acc = TensorOf({5, 4}, std::vector<double>(20, 1));
  loss();
  ASSERT_TRUE(l.Backward(w.view(), acc.view(), true).ok());
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(acc.data<double>()[i], dx.data<double>()[i] + 1, 1e-12);
}

// bf16 activations in and out are the CUDA bf16 recipe's (the GEMMs round
// to bf16 there anyway); elsewhere they would silently change the numerics,
// so they are refused.
TEST(LinearTest, Bf16ActivationsOnlyOnCudaWithTheBf16Recipe) {
  ParameterRegistry registry(DType::kFloat64, 2);
  Linear l(Fp64Context(&registry), "proj", 4, 3, false);
  Tensor x = RandomTensor({5, 4}, 3);
  Tensor y;
  const absl::Status s = l.Forward(x.view(), &y, DType::kBFloat16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("all-bf16 recipe"), std::string::npos) << s;
  EXPECT_TRUE(l.Forward(x.view(), &y, DType::kFloat64).ok());
}

TEST(RmsNormTest, Bf16OutputOnlyOnCuda) {
  ParameterRegistry registry(DType::kFloat64, 2);
  RmsNorm norm(Fp64Context(&registry), "norm", 4);
  Tensor x = RandomTensor({5, 4}, 3);
  Tensor y;
  const absl::Status s = norm.Forward(x.view(), &y, DType::kBFloat16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("needs CUDA"), std::string::npos) << s;
  EXPECT_TRUE(norm.Forward(x.view(), &y, DType::kFloat64).ok());
}

TEST(LinearTest, ZeroRowsComputeNothing) {
  ParameterRegistry registry(DType::kFloat64, 2);
  Linear l(Fp64Context(&registry), "proj", 4, 3, false);
  Tensor x = Tensor::HostZeros(DType::kFloat64, {0, 4});
  Tensor y;
  ASSERT_TRUE(l.Forward(x.view(), &y).ok());
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  EXPECT_TRUE(l.Backward(y.view(), x.view(), false).ok());
}

// The job's per-layer recipe (ctx.linear_recipe_of) picks each layer's
// GEMMs by name: the named layer computes exactly what the FP8 kernels
// compute (the CPU reference quantizes the same way), another layer keeps
// ctx.recipe, and a call whose rows the FP8 GEMMs cannot take (not a
// multiple of 16) or a layer too narrow for them runs at ctx.recipe too.
TEST(LinearTest, PerLayerRecipeByName) {
  ParameterRegistry registry(DType::kFloat64, 3);
  LayerContext ctx = Fp64Context(&registry);
  const LinearRecipe fp8{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                         GemmPrecision::kBf16};
  ctx.linear_recipe_of = [&](const std::string& name) {
    return name == "fp8" || name == "narrow" ? fp8 : ctx.recipe;
  };
  Linear named(ctx, "fp8", 32, 32, true), other(ctx, "other", 32, 32, true);
  Linear narrow(ctx, "narrow", 32, 1, false);
  std::copy_n(named.weight().value.data<double>(), 32 * 32, other.weight().value.data<double>());
  auto expect = [&](Linear& l, const Tensor& x, const LinearRecipe& recipe) {
    Tensor y, want = Tensor::HostZeros(DType::kFloat64, {x.shape()[0], l.out()});
    ASSERT_TRUE(l.Forward(x.view(), &y).ok());
    const TensorView bias = l.bias() != nullptr ? l.bias()->value.view() : TensorView();
    ASSERT_TRUE(LinearForward(x.view(), l.weight().value.view(), bias, want.view(), recipe).ok());
    EXPECT_EQ(Values(y.view()), Values(want.view())) << x.shape()[0] << " rows";
  };
  const Tensor x32 = RandomTensor({32, 32}, 4), x5 = RandomTensor({5, 32}, 5);
  expect(named, x32, fp8);
  expect(named, x5, ctx.recipe);
  expect(other, x32, ctx.recipe);
  expect(narrow, x32, ctx.recipe);
  // FP8 changes the result (E4M3 keeps 3 mantissa bits): the recipe is not
  // a no-op.
  Tensor a, b;
  ASSERT_TRUE(named.Forward(x32.view(), &a).ok());
  ASSERT_TRUE(other.Forward(x32.view(), &b).ok());
  EXPECT_NE(Values(a.view()), Values(b.view()));
  // The backward runs the same recipe (dgrad FP8, wgrad as the recipe says).
  Tensor dy = RandomTensor({32, 32}, 6);
  Tensor dx = Tensor::HostZeros(DType::kFloat64, {32, 32});
  Tensor want = Tensor::HostZeros(DType::kFloat64, {32, 32});
  ASSERT_TRUE(named.Forward(x32.view(), &a).ok());
  ASSERT_TRUE(registry.ZeroGradients().ok());
  ASSERT_TRUE(named.Backward(dy.view(), dx.view(), false).ok());
  ASSERT_TRUE(LinearBackwardInput(dy.view(), named.weight().value.view(), want.view(), fp8).ok());
  EXPECT_EQ(Values(dx.view()), Values(want.view()));
}

TEST(RmsNormTest, ForwardByHandAndBackward) {
  ParameterRegistry registry(DType::kFloat64, 1);
  RmsNorm norm(Fp64Context(&registry), "norm", 2);
  EXPECT_THAT(Values(norm.gamma().value.view()), ElementsAre(1, 1));
  // rms([3, 4]) = sqrt(12.5).
  Tensor x = TensorOf({1, 2}, {3, 4});
  Tensor y;
  ASSERT_TRUE(norm.Forward(x.view(), &y).ok());
  const double rms = std::sqrt(12.5 + RmsNorm::kEpsilon);
  EXPECT_NEAR(y.data<double>()[0], 3 / rms, 1e-7);
  EXPECT_NEAR(y.data<double>()[1], 4 / rms, 1e-7);

  Tensor xs = RandomTensor({3, 4}, 5);
  RmsNorm wide(Fp64Context(&registry), "wide", 4);
  wide.gamma().value.data<double>()[1] = 0.5;
  Tensor w = RandomTensor({3, 4}, 6);
  auto loss = [&] {
    EXPECT_TRUE(wide.Forward(xs.view(), &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dx = TensorOf({3, 4}, std::vector<double>(12, 0));
  ASSERT_TRUE(wide.Backward(w.view(), dx.view()).ok());
  ExpectGradient(loss, xs.view(), dx.view(), "x");
  ExpectGradient(loss, wide.gamma().value.view(), wide.gamma().grad.view(), "gamma");
}

}  // namespace
}  // namespace recfleet::engine::layers
