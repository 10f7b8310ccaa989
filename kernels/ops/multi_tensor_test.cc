#include "kernels/ops/multi_tensor.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/formats.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/multi_tensor_layout.h"

namespace recfleet {
namespace {

std::vector<MultiTensorEntry> Entries(const std::vector<int64_t>& sizes) {
  std::vector<MultiTensorEntry> e(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) e[k].numel = sizes[k];
  return e;
}

TEST(MultiTensorLayoutTest, NumbersChunksConsecutivelyAndDropsEmptyTensors) {
  std::vector<MultiTensorEntry> e = Entries({10, 0, 4, 1, 0, 9});
  EXPECT_EQ(AssignChunks(&e, 4), 3 + 1 + 1 + 3);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].numel, 10);
  EXPECT_EQ(e[0].first_chunk, 0);
  EXPECT_EQ(e[1].numel, 4);
  EXPECT_EQ(e[1].first_chunk, 3);
  EXPECT_EQ(e[2].numel, 1);
  EXPECT_EQ(e[2].first_chunk, 4);
  EXPECT_EQ(e[3].numel, 9);
  EXPECT_EQ(e[3].first_chunk, 5);
}

TEST(MultiTensorLayoutTest, EveryElementBelongsToExactlyOneChunk) {
  // What a launch does: block c finds its owner and covers
  // [(c - first) * chunk, min(+chunk, numel)) of it.
  const int64_t chunk = 7;
  const std::vector<int64_t> sizes = {1, 7, 8, 0, 20, 14, 3};
  std::vector<MultiTensorEntry> e = Entries(sizes);
  const int64_t total = AssignChunks(&e, chunk);
  std::vector<std::vector<int>> seen(e.size());
  for (size_t k = 0; k < e.size(); ++k) seen[k].assign(e[k].numel, 0);
  for (int64_t c = 0; c < total; ++c) {
    const int k = FindChunkOwner(e.data(), static_cast<int>(e.size()), c);
    const int64_t begin = (c - e[k].first_chunk) * chunk;
    ASSERT_GE(begin, 0) << c;
    ASSERT_LT(begin, e[k].numel) << "chunk " << c << " past the end of entry " << k;
    for (int64_t i = begin; i < std::min(begin + chunk, e[k].numel); ++i) ++seen[k][i];
  }
  for (size_t k = 0; k < e.size(); ++k) {
    for (int64_t i = 0; i < e[k].numel; ++i) EXPECT_EQ(seen[k][i], 1) << k << " " << i;
  }
}

TEST(MultiTensorLayoutTest, EmptyListHasNoChunks) {
  std::vector<MultiTensorEntry> e = Entries({0, 0});
  EXPECT_EQ(AssignChunks(&e), 0);
  EXPECT_TRUE(e.empty());
}

struct Host {
  explicit Host(std::vector<float> values)
      : p(std::move(values)), g(p.size()), m(p.size()), v(p.size()), b(p.size()) {}
  AdamTensors Views(bool with_bf16) {
    const int64_t n = static_cast<int64_t>(p.size());
    return {MakeView(p.data(), DType::kFloat32, {n}), MakeView(g.data(), DType::kFloat32, {n}),
            MakeView(m.data(), DType::kFloat32, {n}), MakeView(v.data(), DType::kFloat32, {n}),
            with_bf16 ? MakeView(b.data(), DType::kBFloat16, {n}) : TensorView()};
  }
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> b;
};

TEST(MultiTensorAdamTest, CpuStepZeroAndCopiesMatchThePerTensorOps) {
  AdamConfig c;
  c.lr = 0.03;
  c.weight_decay = 0.1;
  Host a({1.0f, -2.0f, 0.5f}), b({0.25f, 3.0f});
  Host ra = a, rb = b;
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> multi =
      MultiTensorAdam::Create({a.Views(true), b.Views(false)});
  ASSERT_TRUE(multi.ok()) << multi.status();
  for (int t = 1; t <= 3; ++t) {
    for (Host* h : {&a, &b, &ra, &rb}) {
      for (size_t i = 0; i < h->g.size(); ++i) h->g[i] = 0.1f * t - 0.2f * i;
    }
    ASSERT_TRUE((*multi)->Step(c, t).ok());
    for (Host* h : {&ra, &rb}) {
      AdamTensors r = h->Views(false);
      ASSERT_TRUE(AdamStep(c, t, r.param, r.grad, r.m, r.v).ok());
    }
  }
  EXPECT_EQ(a.p, ra.p);
  EXPECT_EQ(a.m, ra.m);
  EXPECT_EQ(b.v, rb.v);
  EXPECT_NE(a.p[0], 1.0f);  // It moved.

  ASSERT_TRUE((*multi)->ZeroGradients().ok());
  EXPECT_EQ(a.g, std::vector<float>(3, 0.0f));
  EXPECT_EQ(b.g, std::vector<float>(2, 0.0f));

  ASSERT_TRUE((*multi)->WriteBf16Copies().ok());
  for (size_t i = 0; i < a.p.size(); ++i) EXPECT_EQ(a.b[i], FloatToBFloat16(a.p[i])) << i;
  EXPECT_EQ(b.b, std::vector<uint16_t>(2, 0));  // No copy asked for: untouched.
  EXPECT_TRUE((*multi)->has_bf16_copies());
}

TEST(MultiTensorAdamTest, RejectsMismatchedEntriesAndBadSteps) {
  Host a({1.0f, 2.0f}), b({1.0f, 2.0f, 3.0f});
  AdamTensors bad = a.Views(false);
  bad.m = b.Views(false).m;
  EXPECT_FALSE(MultiTensorAdam::Create({bad}).ok());
  AdamTensors bad_copy = a.Views(false);
  bad_copy.bf16 = MakeView(b.b.data(), DType::kBFloat16, {3});
  EXPECT_FALSE(MultiTensorAdam::Create({bad_copy}).ok());
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> ok = MultiTensorAdam::Create({a.Views(false)});
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE((*ok)->Step(AdamConfig{}, 0).ok());
}

}  // namespace
}  // namespace recfleet
