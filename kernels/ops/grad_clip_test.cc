// Global-norm clipping on the CPU: the clip factor's cases, the squared
// norm of a multi-tensor list, and a clipped AdamW step against a float64
// reference written here from clip_grad_norm_'s definition.

#include "kernels/ops/grad_clip.h"

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/multi_tensor.h"

namespace recfleet {
namespace {

double Scale(double sum_sq, double max_norm) {
  double sum = sum_sq, scale = -7;  // Poisoned.
  EXPECT_TRUE(GradClipScale(MakeView(&sum, DType::kFloat64, {1}), max_norm,
                            MakeView(&scale, DType::kFloat64, {1}))
                  .ok());
  return scale;
}

TEST(GradClipScaleTest, FollowsClipGradNorm) {
  EXPECT_DOUBLE_EQ(Scale(16.0, 2.0), 2.0 / (4.0 + 1e-6));  // Active: norm 4 > 2.
  EXPECT_EQ(Scale(1.0, 2.0), 1.0);                          // Inactive: never scales up.
  EXPECT_EQ(Scale(0.0, 2.0), 1.0);
  EXPECT_EQ(Scale(std::numeric_limits<double>::infinity(), 2.0), 0.0);
  EXPECT_TRUE(std::isnan(Scale(std::nan(""), 2.0)));  // Kept, as the clamp keeps it.
  float sum = 9.0f, scale = 0;
  ASSERT_TRUE(GradClipScale(MakeView(&sum, DType::kFloat32, {1}), 1.5,
                            MakeView(&scale, DType::kFloat32, {1}))
                  .ok());
  EXPECT_EQ(scale, static_cast<float>(1.5 / (3.0 + 1e-6)));
}

TEST(GradClipScaleTest, RejectsBadMaxNormAndLayouts) {
  double sum = 1, scale = 0;
  float f = 0;
  const TensorView s = MakeView(&sum, DType::kFloat64, {1}), out = MakeView(&scale, DType::kFloat64, {1});
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(GradClipScale(s, bad, out).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(GradClipScale(s, 1.0, MakeView(&f, DType::kFloat32, {1})).ok());
  double two[2] = {1, 1};
  EXPECT_FALSE(GradClipScale(s, 1.0, MakeView(two, DType::kFloat64, {2})).ok());
}

// A sharded model's norm in parts (e.g. dense shards and experts): their sum.
TEST(GradClipScaleTest, AddsThePartsOfTheSquaredNorm) {
  double parts[3] = {9, 0, 7}, scale = -1;
  ASSERT_TRUE(GradClipScale(MakeView(parts, DType::kFloat64, {3}), 2.0, MakeView(&scale, DType::kFloat64, {1})).ok());
  EXPECT_DOUBLE_EQ(scale, 2.0 / (4.0 + 1e-6));
}

struct Param {
  std::vector<float> p, g, m, v;
  AdamTensors Views() {
    const int64_t n = static_cast<int64_t>(p.size());
    return {MakeView(p.data(), DType::kFloat32, {n}), MakeView(g.data(), DType::kFloat32, {n}),
            MakeView(m.data(), DType::kFloat32, {n}), MakeView(v.data(), DType::kFloat32, {n})};
  }
};

// Ragged sizes (1, a few, a few hundred, empty), fresh random values.
std::vector<Param> RandomParams(std::mt19937& rng, float grad_scale) {
  std::normal_distribution<float> normal;
  std::vector<Param> ps;
  for (int n : {1, 7, 300, 0, 33}) {
    Param q;
    for (int i = 0; i < n; ++i) {
      q.p.push_back(normal(rng));
      q.g.push_back(grad_scale * normal(rng));
      q.m.push_back(0.01f * normal(rng));
      q.v.push_back(0.01f * std::abs(normal(rng)));
    }
    ps.push_back(q);
  }
  return ps;
}

// AdamW step 3 in float64 after clipping the whole list to `max_norm`.
void ReferenceStep(std::vector<Param>& ps, const AdamConfig& c, int64_t step, double max_norm,
                   std::vector<std::vector<double>>* out) {
  double sum = 0;
  for (const Param& q : ps) {
    for (float g : q.g) sum += static_cast<double>(g) * g;
  }
  const double scale = std::min(1.0, max_norm / (std::sqrt(sum) + 1e-6));
  const double bc1 = 1 - std::pow(c.beta1, step), bc2 = 1 - std::pow(c.beta2, step);
  for (const Param& q : ps) {
    std::vector<double> p(q.p.begin(), q.p.end());
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = q.g[i] * scale;
      const double m = c.beta1 * q.m[i] + (1 - c.beta1) * g;
      const double v = c.beta2 * q.v[i] + (1 - c.beta2) * g * g;
      p[i] = p[i] * (1 - c.lr * c.weight_decay) - c.lr * (m / bc1) / (std::sqrt(v / bc2) + c.eps);
    }
    out->push_back(p);
  }
}

void ExpectClippedStepMatchesReference(float grad_scale, double max_norm, bool expect_active) {
  std::mt19937 rng(17 + static_cast<int>(grad_scale * 10));
  std::vector<Param> ps = RandomParams(rng, grad_scale);
  AdamConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  std::vector<std::vector<double>> want;
  ReferenceStep(ps, c, 3, max_norm, &want);
  std::vector<AdamTensors> views;
  for (Param& q : ps) views.push_back(q.Views());
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> multi = MultiTensorAdam::Create(views);
  ASSERT_TRUE(multi.ok()) << multi.status();
  float sum = -1, scale = -1;
  const TensorView sum_view = MakeView(&sum, DType::kFloat32, {1}), scale_view = MakeView(&scale, DType::kFloat32, {1});
  ASSERT_TRUE((*multi)->GradSquaredNorm(sum_view, /*accumulate=*/false).ok());
  ASSERT_TRUE(GradClipScale(sum_view, max_norm, scale_view).ok());
  EXPECT_EQ(scale < 1.0f, expect_active) << "norm " << std::sqrt(sum);
  c.grad_scale = scale_view;
  ASSERT_TRUE((*multi)->Step(c, 3).ok());
  for (size_t k = 0; k < ps.size(); ++k) {
    for (size_t i = 0; i < want[k].size(); ++i) {
      EXPECT_NEAR(ps[k].p[i], want[k][i], 2e-6 * std::max(1.0, std::abs(want[k][i]))) << k << " " << i;
    }
  }
}

TEST(GradClipTest, ClippedAdamWStepMatchesFloat64ReferenceWhenActive) {
  ExpectClippedStepMatchesReference(/*grad_scale=*/3.0f, /*max_norm=*/1.0, /*expect_active=*/true);
}

TEST(GradClipTest, ClippedAdamWStepMatchesFloat64ReferenceWhenInactive) {
  ExpectClippedStepMatchesReference(/*grad_scale=*/0.001f, /*max_norm=*/1.0, /*expect_active=*/false);
}

TEST(GradClipTest, SquaredNormAccumulatesAcrossLists) {
  std::vector<float> a = {3, 0, 0}, b = {4};
  std::vector<float> zeros(3);
  AdamTensors ta{MakeView(zeros.data(), DType::kFloat32, {3}), MakeView(a.data(), DType::kFloat32, {3}),
                 MakeView(zeros.data(), DType::kFloat32, {3}), MakeView(zeros.data(), DType::kFloat32, {3})};
  std::vector<float> one(1);
  AdamTensors tb{MakeView(one.data(), DType::kFloat32, {1}), MakeView(b.data(), DType::kFloat32, {1}),
                 MakeView(one.data(), DType::kFloat32, {1}), MakeView(one.data(), DType::kFloat32, {1})};
  auto ma = MultiTensorAdam::Create({ta}), mb = MultiTensorAdam::Create({tb});
  ASSERT_TRUE(ma.ok() && mb.ok());
  float sum = 100;
  const TensorView s = MakeView(&sum, DType::kFloat32, {1});
  ASSERT_TRUE((*ma)->GradSquaredNorm(s, false).ok());
  EXPECT_EQ(sum, 9.0f);
  ASSERT_TRUE((*mb)->GradSquaredNorm(s, true).ok());
  EXPECT_EQ(sum, 25.0f);
  double wrong = 0;
  EXPECT_FALSE((*ma)->GradSquaredNorm(MakeView(&wrong, DType::kFloat64, {1}), false).ok());
}

// A non-finite gradient anywhere: as clip_grad_norm_, the NaN scale reaches
// every parameter (the step goes ahead; nothing is skipped).
TEST(GradClipTest, NanGradientPoisonsEveryParameterAsPyTorchDoes) {
  std::mt19937 rng(5);
  std::vector<Param> ps = RandomParams(rng, 1.0f);
  ps[2].g[10] = std::nanf("");
  std::vector<AdamTensors> views;
  for (Param& q : ps) views.push_back(q.Views());
  auto multi = MultiTensorAdam::Create(views);
  ASSERT_TRUE(multi.ok());
  float sum = 0, scale = 0;
  const TensorView s = MakeView(&sum, DType::kFloat32, {1}), f = MakeView(&scale, DType::kFloat32, {1});
  ASSERT_TRUE((*multi)->GradSquaredNorm(s, false).ok());
  ASSERT_TRUE(GradClipScale(s, 1.0, f).ok());
  AdamConfig c;
  c.grad_scale = f;
  ASSERT_TRUE((*multi)->Step(c, 1).ok());
  for (const Param& q : ps) {
    for (float p : q.p) EXPECT_TRUE(std::isnan(p));
  }
}

TEST(GradClipTest, AdamRejectsAScaleOfAnotherLayout) {
  std::vector<float> p = {1, 2}, g = {1, 1}, m(2), v(2);
  double scale = 1;
  AdamConfig c;
  c.grad_scale = MakeView(&scale, DType::kFloat64, {1});
  EXPECT_EQ(AdamStep(c, 1, MakeView(p.data(), DType::kFloat32, {2}), MakeView(g.data(), DType::kFloat32, {2}),
                     MakeView(m.data(), DType::kFloat32, {2}), MakeView(v.data(), DType::kFloat32, {2}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet
