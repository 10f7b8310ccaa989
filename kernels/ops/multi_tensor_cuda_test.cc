// Needs a GPU. The multi-tensor passes against the per-tensor ones on the
// same device: Adam bit for bit (one arithmetic), zeroed gradients, bf16
// copies equal to the host's round-to-nearest-even; the gradient norm and
// a clipped step against the CPU's.

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/grad_clip.h"
#include "kernels/ops/multi_tensor.h"
#include "kernels/ops/multi_tensor_layout.h"

namespace recfleet {
namespace {

struct Dev {
  explicit Dev(const std::vector<float>& init)
      : n(static_cast<int64_t>(init.size())),
        p(init),
        g(std::vector<float>(init.size())),
        m(std::vector<float>(init.size())),
        v(std::vector<float>(init.size())),
        b(std::vector<uint16_t>(init.size())) {}
  AdamTensors Views(bool with_bf16) const {
    return {p.View(DType::kFloat32, {n}), g.View(DType::kFloat32, {n}),
            m.View(DType::kFloat32, {n}), v.View(DType::kFloat32, {n}),
            with_bf16 ? b.View(DType::kBFloat16, {n}) : TensorView()};
  }
  void SetGrad(int t) const {
    std::vector<float> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = 0.001f * ((i * 7919 + t * 31) % 2001 - 1000);
    CudaOrDie(cudaMemcpy(g.get(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "grad");
  }
  int64_t n;
  DeviceBuffer p, g, m, v, b;
};

std::vector<float> Init(int64_t n, float scale) {
  std::vector<float> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = scale * ((i * 104729) % 1999 - 999) / 999.0f;
  return h;
}

TEST(MultiTensorCudaTest, MatchesPerTensorAdamBitForBit) {
  // Sizes around chunk edges, one empty, one of several chunks.
  const std::vector<int64_t> sizes = {1, kMultiTensorChunk - 1, kMultiTensorChunk, 0,
                                      kMultiTensorChunk + 1, 3 * kMultiTensorChunk + 17, 5};
  std::vector<std::unique_ptr<Dev>> multi, ref;
  std::vector<AdamTensors> views;
  for (size_t k = 0; k < sizes.size(); ++k) {
    multi.push_back(std::make_unique<Dev>(Init(sizes[k], 0.5f + k)));
    ref.push_back(std::make_unique<Dev>(Init(sizes[k], 0.5f + k)));
    views.push_back(multi.back()->Views(k % 2 == 0));
  }
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> adam = MultiTensorAdam::Create(views);
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ((*adam)->num_chunks(), 1 + 1 + 1 + 2 + 4 + 1);
  AdamConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.05;
  for (int t = 1; t <= 4; ++t) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      multi[k]->SetGrad(t);
      ref[k]->SetGrad(t);
      const AdamTensors r = ref[k]->Views(false);
      ASSERT_TRUE(AdamStep(c, t, r.param, r.grad, r.m, r.v).ok());
    }
    ASSERT_TRUE((*adam)->Step(c, t).ok());
  }
  ASSERT_TRUE((*adam)->WriteBf16Copies().ok());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const std::vector<float> p = multi[k]->p.ToHost<float>();
    EXPECT_EQ(p, ref[k]->p.ToHost<float>()) << k;
    EXPECT_EQ(multi[k]->m.ToHost<float>(), ref[k]->m.ToHost<float>()) << k;
    EXPECT_EQ(multi[k]->v.ToHost<float>(), ref[k]->v.ToHost<float>()) << k;
    const std::vector<uint16_t> b = multi[k]->b.ToHost<uint16_t>();
    for (int64_t i = 0; i < sizes[k]; ++i) {
      ASSERT_EQ(b[i], k % 2 == 0 ? FloatToBFloat16(p[i]) : 0) << k << " " << i;
    }
  }
  ASSERT_TRUE((*adam)->ZeroGradients().ok());
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(multi[k]->g.ToHost<float>(), std::vector<float>(sizes[k], 0.0f)) << k;
  }
}

// The AdamW pass that also writes the bf16 copies: param, m and v equal the
// plain pass's bit for bit, every copy equals the host's rounding of the new
// param (poisoned beforehand, so a copy left unwritten shows), and entries
// without a copy keep none.
TEST(MultiTensorCudaTest, StepWritingBf16CopiesMatchesStepThenCopies) {
  const std::vector<int64_t> sizes = {kMultiTensorChunk + 1, 1, 0, 3 * kMultiTensorChunk + 17,
                                      kMultiTensorChunk - 1, 5};
  std::vector<std::unique_ptr<Dev>> fused, plain;
  std::vector<AdamTensors> fused_views, plain_views;
  for (size_t k = 0; k < sizes.size(); ++k) {
    fused.push_back(std::make_unique<Dev>(Init(sizes[k], 0.7f + k)));
    plain.push_back(std::make_unique<Dev>(Init(sizes[k], 0.7f + k)));
    fused_views.push_back(fused.back()->Views(k != 1));
    plain_views.push_back(plain.back()->Views(k != 1));
  }
  auto a = MultiTensorAdam::Create(fused_views);
  auto b = MultiTensorAdam::Create(plain_views);
  ASSERT_TRUE(a.ok() && b.ok());
  AdamConfig c;
  c.lr = 0.02;
  c.weight_decay = 0.1;
  for (int t = 1; t <= 3; ++t) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      fused[k]->SetGrad(t);
      plain[k]->SetGrad(t);
      // Poison: 0x7fc1 is a NaN that no rounding of these values gives.
      const std::vector<uint16_t> poison(sizes[k], 0x7fc1);
      if (sizes[k] > 0) {
        CudaOrDie(cudaMemcpy(fused[k]->b.get(), poison.data(), sizes[k] * sizeof(uint16_t),
                             cudaMemcpyHostToDevice), "poison");
      }
    }
    ASSERT_TRUE((*a)->StepWritingBf16Copies(c, t).ok());
    ASSERT_TRUE((*b)->Step(c, t).ok());
    ASSERT_TRUE((*b)->WriteBf16Copies().ok());
    for (size_t k = 0; k < sizes.size(); ++k) {
      const std::vector<float> p = fused[k]->p.ToHost<float>();
      ASSERT_EQ(p, plain[k]->p.ToHost<float>()) << "step " << t << " entry " << k;
      ASSERT_EQ(fused[k]->m.ToHost<float>(), plain[k]->m.ToHost<float>()) << k;
      ASSERT_EQ(fused[k]->v.ToHost<float>(), plain[k]->v.ToHost<float>()) << k;
      const std::vector<uint16_t> copy = fused[k]->b.ToHost<uint16_t>();
      if (k != 1) {
        EXPECT_EQ(copy, plain[k]->b.ToHost<uint16_t>()) << k;
      }
      for (int64_t i = 0; i < sizes[k]; ++i) {
        ASSERT_EQ(copy[i], k != 1 ? FloatToBFloat16(p[i]) : 0x7fc1) << k << " " << i;
      }
    }
  }
}

// Fresh random gradients on both sides: the device's squared norm (chunk
// partials added in fp64) against the host's fp64 sum, the same bits on a
// second run, the clip factor, and a clipped step against the CPU's
// multi-tensor step with the same factor.
TEST(MultiTensorCudaTest, GradientNormAndClippedStepMatchTheCpu) {
  const std::vector<int64_t> sizes = {1, kMultiTensorChunk - 1, 0, kMultiTensorChunk + 1,
                                      3 * kMultiTensorChunk + 17, 5};
  std::mt19937 rng(20261202);  // Fixed: a tolerance failure reproduces.
  std::normal_distribution<float> normal;
  std::vector<std::unique_ptr<Dev>> dev;
  std::vector<std::vector<float>> hp, hg, hm, hv;
  std::vector<AdamTensors> dviews, hviews;
  double sum = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    hp.push_back(Init(sizes[k], 0.3f + k));
    dev.push_back(std::make_unique<Dev>(hp.back()));
    std::vector<float> g(sizes[k]);
    for (float& x : g) {
      x = 0.01f * normal(rng);
      sum += static_cast<double>(x) * x;
    }
    CudaOrDie(cudaMemcpy(dev.back()->g.get(), g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice), "g");
    hg.push_back(g);
    hm.emplace_back(sizes[k]);
    hv.emplace_back(sizes[k]);
    dviews.push_back(dev.back()->Views(false));
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    hviews.push_back({MakeView(hp[k].data(), DType::kFloat32, {sizes[k]}),
                      MakeView(hg[k].data(), DType::kFloat32, {sizes[k]}),
                      MakeView(hm[k].data(), DType::kFloat32, {sizes[k]}),
                      MakeView(hv[k].data(), DType::kFloat32, {sizes[k]})});
  }
  auto gpu = MultiTensorAdam::Create(dviews);
  auto cpu = MultiTensorAdam::Create(hviews);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  DeviceBuffer clip(std::vector<float>{-1.0f, -1.0f});  // Poisoned: {sum, scale}.
  const TensorView dsum = MakeView(clip.get(), DType::kFloat32, {1}, Device::kCuda);
  const TensorView dscale = MakeView(static_cast<float*>(clip.get()) + 1, DType::kFloat32, {1}, Device::kCuda);
  ASSERT_TRUE((*gpu)->GradSquaredNorm(dsum, false).ok());
  const std::vector<float> first = clip.ToHost<float>();
  EXPECT_NEAR(first[0], sum, 1e-5 * sum);
  ASSERT_TRUE((*gpu)->GradSquaredNorm(dsum, false).ok());
  EXPECT_EQ(clip.ToHost<float>()[0], first[0]);  // Deterministic.
  ASSERT_TRUE((*gpu)->GradSquaredNorm(dsum, true).ok());
  EXPECT_NEAR(clip.ToHost<float>()[0], 2 * sum, 1e-5 * sum);
  ASSERT_TRUE((*gpu)->GradSquaredNorm(dsum, false).ok());
  const double max_norm = 0.3 * std::sqrt(sum);
  ASSERT_TRUE(GradClipScale(dsum, max_norm, dscale).ok());
  const float scale = clip.ToHost<float>()[1];
  EXPECT_NEAR(scale, max_norm / (std::sqrt(static_cast<double>(first[0])) + 1e-6), 1e-6);
  float host_scale = scale;
  AdamConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.05;
  c.grad_scale = dscale;
  ASSERT_TRUE((*gpu)->Step(c, 1).ok());
  c.grad_scale = MakeView(&host_scale, DType::kFloat32, {1});
  ASSERT_TRUE((*cpu)->Step(c, 1).ok());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const std::vector<float> p = dev[k]->p.ToHost<float>();
    for (int64_t i = 0; i < sizes[k]; ++i) {
      ASSERT_NEAR(p[i], hp[k][i], 1e-6 * std::max(1.0f, std::abs(hp[k][i]))) << k << " " << i;
    }
  }
  // A NaN gradient: a NaN factor, every parameter NaN (clip_grad_norm_).
  const float nan = std::nanf("");
  CudaOrDie(cudaMemcpy(static_cast<float*>(dev[4]->g.get()) + 100, &nan, sizeof(float), cudaMemcpyHostToDevice), "nan");
  ASSERT_TRUE((*gpu)->GradSquaredNorm(dsum, false).ok());
  ASSERT_TRUE(GradClipScale(dsum, max_norm, dscale).ok());
  c.grad_scale = dscale;
  ASSERT_TRUE((*gpu)->Step(c, 2).ok());
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (float x : dev[k]->p.ToHost<float>()) ASSERT_TRUE(std::isnan(x)) << k;
  }
}

}  // namespace
}  // namespace recfleet
