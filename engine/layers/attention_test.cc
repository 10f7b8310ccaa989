#include "engine/layers/attention.h"

#include <string>
#include <vector>

#include "engine/layers/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {
namespace {

TensorView Offsets(std::vector<int64_t>& o) {
  return MakeView(o.data(), DType::kInt64, {static_cast<int64_t>(o.size())});
}

std::vector<std::string> Names(const ParameterRegistry& r) {
  std::vector<std::string> names;
  for (const Parameter* p : r.all()) names.push_back(p->name);
  return names;
}

void Randomize(const ParameterRegistry& r, uint64_t seed) {
  for (const Parameter* p : r.all()) {
    Tensor t = RandomTensor(p->value.shape(), seed++, 0.5);
    std::copy_n(t.data<double>(), t.numel(), p->value.data<double>());
  }
}

class SelfAttentionBlockTest : public ::testing::TestWithParam<attention::Activation> {};

// Sequences of 3, 0 and 2 tokens; dim 4 in 2 heads, causal with RoPE.
TEST_P(SelfAttentionBlockTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  attention::AttentionOptions o;
  o.activation = GetParam();
  o.mask = attention::Mask::kCausal;
  o.rope = true;
  SelfAttentionBlock block(Fp64Context(&registry), "seq0", 4, 2, o);
  EXPECT_THAT(Names(registry),
              ::testing::ElementsAre("seq0.norm", "seq0.q.w", "seq0.k.w", "seq0.v.w", "seq0.o.w",
                                     "seq0.o.b"));
  Randomize(registry, 10);
  std::vector<int64_t> off = {0, 3, 3, 5};
  Tensor x = RandomTensor({5, 4}, 1), w = RandomTensor({5, 4}, 2), y;
  auto loss = [&] {
    EXPECT_TRUE(block.Forward({x.view(), Offsets(off)}, &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  // In place, as the model runs it: dx overwrites dy.
  Tensor d = RandomTensor({5, 4}, 2);
  ASSERT_TRUE(block.Backward(d.view(), d.view()).ok());
  ExpectGradient(loss, x.view(), d.view(), "x");
  ExpectParameterGradients(loss, registry);
}

INSTANTIATE_TEST_SUITE_P(Activations, SelfAttentionBlockTest,
                         ::testing::Values(attention::Activation::kSoftmax,
                                           attention::Activation::kGelu));

TEST(CrossAttentionTest, EmptyHistoryLeavesTokensPlusBias) {
  ParameterRegistry registry(DType::kFloat64, 1);
  CrossAttention cross(Fp64Context(&registry), "cross", 4, 2);
  Randomize(registry, 20);
  Parameter* bias = registry.Find("cross.o.b");
  ASSERT_NE(bias, nullptr);
  // Sample 0: 2 tokens, 3 history events; sample 1: 2 tokens, no history.
  std::vector<int64_t> token_off = {0, 2, 4}, hist_off = {0, 3, 3};
  Tensor t = RandomTensor({4, 4}, 1), h = RandomTensor({3, 4}, 2), y;
  ASSERT_TRUE(cross.Forward({t.view(), Offsets(token_off)}, {h.view(), Offsets(hist_off)}, &y).ok());
  for (int64_t r = 2; r < 4; ++r) {
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_NEAR(y.data<double>()[r * 4 + c], t.data<double>()[r * 4 + c] + bias->value.data<double>()[c],
                  1e-14);
    }
  }
}

TEST(CrossAttentionTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  CrossAttention cross(Fp64Context(&registry), "cross", 4, 2);
  Randomize(registry, 30);
  std::vector<int64_t> token_off = {0, 2, 4}, hist_off = {0, 3, 3};
  Tensor t = RandomTensor({4, 4}, 1), h = RandomTensor({3, 4}, 2), w = RandomTensor({4, 4}, 3), y;
  auto loss = [&] {
    EXPECT_TRUE(cross.Forward({t.view(), Offsets(token_off)}, {h.view(), Offsets(hist_off)}, &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dt = RandomTensor({4, 4}, 9);  // Overwritten.
  Tensor dh = Tensor::HostZeros(DType::kFloat64, {3, 4});
  ASSERT_TRUE(cross.Backward(w.view(), dt.view(), dh.view()).ok());
  ExpectGradient(loss, t.view(), dt.view(), "tokens");
  ExpectGradient(loss, h.view(), dh.view(), "history");
  ExpectParameterGradients(loss, registry);
  // The history gradient accumulates: a second backward doubles it.
  const std::vector<double> once = Values(dh.view());
  ASSERT_TRUE(cross.Backward(w.view(), dt.view(), dh.view()).ok());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(dh.data<double>()[i], 2 * once[i], 1e-12);
}

// The FP8 attention forward runs on CUDA only: a CPU layer asked for it
// fails its forward, saying why, instead of computing in fp64.
TEST(CrossAttentionTest, Fp8ForwardOnTheCpuIsRefused) {
  ParameterRegistry registry(DType::kFloat64, 1);
  CrossAttention cross(Fp64Context(&registry), "cross", 128, 1, attention::ForwardPrecision::kFp8E4M3);
  Randomize(registry, 20);
  std::vector<int64_t> token_off = {0, 1}, hist_off = {0, 2};
  Tensor t = RandomTensor({1, 128}, 1), h = RandomTensor({2, 128}, 2), y;
  const absl::Status s = cross.Forward({t.view(), Offsets(token_off)}, {h.view(), Offsets(hist_off)}, &y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("the FP8 attention forward needs CUDA tensors with head dim 128"));
}

TEST(PmaTest, OneEventPerSampleIgnoresTheQueries) {
  ParameterRegistry registry(DType::kFloat64, 1);
  Pma pma(Fp64Context(&registry), "pma", 4, 2, 3);
  EXPECT_THAT(Names(registry), ::testing::ElementsAre("pma.queries", "pma.k.w", "pma.v.w",
                                                      "pma.o.w", "pma.o.b"));
  std::vector<int64_t> off = {0, 1, 2};
  Tensor h = RandomTensor({2, 4}, 1), y1, y2;
  ASSERT_TRUE(pma.Forward({h.view(), Offsets(off)}, &y1).ok());
  EXPECT_EQ(y1.shape(), (Shape{6, 4}));
  // One key: every query's softmax weight is 1, so all 3 outputs of a
  // sample equal o(v(h)), whatever the queries.
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_NEAR(y1.data<double>()[0 * 4 + c], y1.data<double>()[2 * 4 + c], 1e-14);
    EXPECT_NEAR(y1.data<double>()[3 * 4 + c], y1.data<double>()[5 * 4 + c], 1e-14);
  }
  Parameter* q = registry.Find("pma.queries");
  for (int64_t i = 0; i < q->value.numel(); ++i) q->value.data<double>()[i] += 1.0;
  ASSERT_TRUE(pma.Forward({h.view(), Offsets(off)}, &y2).ok());
  for (int64_t i = 0; i < y1.numel(); ++i) EXPECT_NEAR(y1.data<double>()[i], y2.data<double>()[i], 1e-14);
}

TEST(PmaTest, BackwardMatchesFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  Pma pma(Fp64Context(&registry), "pma", 4, 2, 2);
  Randomize(registry, 40);
  std::vector<int64_t> off = {0, 3, 3, 7};  // Including an empty history.
  Tensor h = RandomTensor({7, 4}, 1), w = RandomTensor({6, 4}, 2), y;
  auto loss = [&] {
    EXPECT_TRUE(pma.Forward({h.view(), Offsets(off)}, &y).ok());
    return Dot(y.view(), w.view());
  };
  loss();
  ASSERT_TRUE(registry.ZeroGradients().ok());
  Tensor dh = Tensor::HostZeros(DType::kFloat64, {7, 4});
  ASSERT_TRUE(pma.Backward(w.view(), dh.view()).ok());
  ExpectGradient(loss, h.view(), dh.view(), "history");
  ExpectParameterGradients(loss, registry);
}

}  // namespace
}  // namespace recfleet::engine::layers
