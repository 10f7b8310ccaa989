// Needs a GPU. The multi-tensor passes against the per-tensor ones on the
// same device: Adam bit for bit (one arithmetic), zeroed gradients, bf16
// copies equal to the host's round-to-nearest-even.

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/ops/adam.h"
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

}  // namespace
}  // namespace recfleet
