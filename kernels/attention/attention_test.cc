// CPU reference tests: float64 central finite differences for every
// activation x mask x option, on jagged batches with the edge cases the
// kernels care about, plus properties the forward must have.

#include "kernels/attention/attention.h"

#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"

namespace recfleet::attention {
namespace {

// Owned float64 storage for one test problem.
struct Problem {
  int64_t heads = 0, d = 0;
  std::vector<int64_t> q_off, k_off;
  std::vector<double> q, k, v, bias;

  AttentionInputs Inputs(bool with_bias) {
    AttentionInputs in;
    const int64_t b = static_cast<int64_t>(q_off.size()) - 1;
    in.q.values = MakeView(q.data(), DType::kFloat64, {q_off.back(), heads, d});
    in.q.offsets = MakeView(q_off.data(), DType::kInt64, {b + 1});
    in.k.values = MakeView(k.data(), DType::kFloat64, {k_off.back(), heads, d});
    in.k.offsets = MakeView(k_off.data(), DType::kInt64, {b + 1});
    in.v = MakeView(v.data(), DType::kFloat64, {k_off.back(), heads, d});
    if (with_bias) {
      in.bias = MakeView(bias.data(), DType::kFloat64, {static_cast<int64_t>(bias.size())});
    }
    return in;
  }
};

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off{0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

Problem MakeProblem(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk, int64_t heads,
                    int64_t d, std::mt19937_64& rng) {
  Problem p;
  p.heads = heads;
  p.d = d;
  p.q_off = Offsets(lq);
  p.k_off = Offsets(lk);
  std::normal_distribution<double> n(0.0, 1.0);
  auto fill = [&](std::vector<double>& x, int64_t count) {
    x.resize(count);
    for (double& e : x) e = n(rng);
  };
  fill(p.q, p.q_off.back() * heads * d);
  fill(p.k, p.k_off.back() * heads * d);
  fill(p.v, p.k_off.back() * heads * d);
  int64_t nb = 0;
  for (size_t b = 0; b < lq.size(); ++b) nb += lq[b] * lk[b];
  fill(p.bias, nb * heads);
  return p;
}

double Loss(Problem& p, bool bias, const AttentionOptions& o, const std::vector<double>& w) {
  AttentionInputs in = p.Inputs(bias);
  std::vector<double> out(p.q.size()), lse(p.q_off.back() * p.heads);
  TensorView lse_view;
  if (o.activation == Activation::kSoftmax) {
    lse_view = MakeView(lse.data(), DType::kFloat64, {p.q_off.back(), p.heads});
  }
  EXPECT_TRUE(
      AttentionForward(in, o, MakeView(out.data(), DType::kFloat64, in.q.values.shape), lse_view)
          .ok());
  double l = 0;
  for (size_t i = 0; i < out.size(); ++i) l += out[i] * w[i];
  return l;
}

// Checks <grad, u> against the central difference along a random direction
// u, for one input tensor `x` of the problem, and a few single coordinates.
void CheckGradient(Problem& p, bool bias, const AttentionOptions& o, const std::vector<double>& w,
                   std::vector<double>& x, const std::vector<double>& grad, const std::string& what,
                   std::mt19937_64& rng) {
  if (x.empty()) return;
  const double eps = 1e-5;
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> u(x.size());
  for (double& e : u) e = n(rng);
  const std::vector<double> x0 = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + eps * u[i];
  const double lp = Loss(p, bias, o, w);
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - eps * u[i];
  const double lm = Loss(p, bias, o, w);
  x = x0;
  double analytic = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    analytic += grad[i] * u[i];
    scale += std::abs(grad[i] * u[i]);
  }
  const double numeric = (lp - lm) / (2 * eps);
  EXPECT_NEAR(analytic, numeric, 1e-6 * (1.0 + scale)) << what << " (directional)";
  std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
  for (int t = 0; t < 3; ++t) {
    const size_t i = pick(rng);
    x[i] = x0[i] + eps;
    const double a = Loss(p, bias, o, w);
    x[i] = x0[i] - eps;
    const double b = Loss(p, bias, o, w);
    x[i] = x0[i];
    EXPECT_NEAR(grad[i], (a - b) / (2 * eps), 1e-6 * (1.0 + std::abs(grad[i])))
        << what << "[" << i << "]";
  }
}

struct Variant {
  Activation act;
  Mask mask;
  bool bias;
  bool qk_norm;
  bool rope;
};

std::string Name(const Variant& v) {
  const char* acts[] = {"softmax", "gelu", "silu"};
  const char* masks[] = {"none", "causal", "window", "block"};
  return absl::StrCat(acts[static_cast<int>(v.act)], "_", masks[static_cast<int>(v.mask)],
                      v.bias ? "_bias" : "", v.qk_norm ? "_qknorm" : "", v.rope ? "_rope" : "");
}

class GradientTest : public ::testing::TestWithParam<Variant> {};

TEST_P(GradientTest, MatchesFiniteDifferences) {
  const Variant var = GetParam();
  std::mt19937_64 rng(1234 + static_cast<int>(var.act) * 16 + static_cast<int>(var.mask));
  // Jagged edge cases: empty sequence, length 1, block boundary +-1, Q
  // longer and shorter than K/V, K/V empty under non-empty Q, and the
  // longest sequence (130 crosses two 64-token blocks).
  const std::vector<int64_t> lq = {0, 1, 63, 3, 65, 9, 130, 4};
  const std::vector<int64_t> lk = {2, 1, 63, 9, 64, 3, 130, 0};
  Problem p = MakeProblem(lq, lk, /*heads=*/2, /*d=*/4, rng);
  AttentionOptions o;
  o.activation = var.act;
  o.mask = var.mask;
  o.window = 5;
  o.qk_norm = var.qk_norm;
  o.rope = var.rope;
  o.scale = var.qk_norm ? 3.0 : 0.0;
  std::vector<double> w(p.q.size());
  std::normal_distribution<double> n(0.0, 1.0);
  for (double& e : w) e = n(rng);

  AttentionInputs in = p.Inputs(var.bias);
  std::vector<double> out(p.q.size()), lse(p.q_off.back() * p.heads);
  TensorView lse_view;
  if (o.activation == Activation::kSoftmax) {
    lse_view = MakeView(lse.data(), DType::kFloat64, {p.q_off.back(), p.heads});
  }
  TensorView out_view = MakeView(out.data(), DType::kFloat64, in.q.values.shape);
  ASSERT_TRUE(AttentionForward(in, o, out_view, lse_view).ok());
  std::vector<double> dq(p.q.size()), dk(p.k.size()), dv(p.v.size()), dbias(p.bias.size());
  AttentionGrads g;
  g.dq = MakeView(dq.data(), DType::kFloat64, in.q.values.shape);
  g.dk = MakeView(dk.data(), DType::kFloat64, in.k.values.shape);
  g.dv = MakeView(dv.data(), DType::kFloat64, in.v.shape);
  if (var.bias) g.dbias = MakeView(dbias.data(), DType::kFloat64, in.bias.shape);
  const absl::Status s =
      AttentionBackward(in, o, out_view, lse_view, MakeView(w.data(), DType::kFloat64,
                                                            in.q.values.shape), g);
  ASSERT_TRUE(s.ok()) << s;
  CheckGradient(p, var.bias, o, w, p.q, dq, "dq", rng);
  CheckGradient(p, var.bias, o, w, p.k, dk, "dk", rng);
  CheckGradient(p, var.bias, o, w, p.v, dv, "dv", rng);
  if (var.bias) CheckGradient(p, var.bias, o, w, p.bias, dbias, "dbias", rng);
}

std::vector<Variant> AllVariants() {
  std::vector<Variant> v;
  for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
    for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow, Mask::kBlock}) {
      v.push_back({a, m, false, false, false});
      v.push_back({a, m, true, false, false});
      v.push_back({a, m, false, true, true});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllVariants, GradientTest, ::testing::ValuesIn(AllVariants()),
                         [](const auto& info) { return Name(info.param); });

// Forward properties that do not depend on the reference's own formulas.
TEST(AttentionForwardTest, MasksSelectTheExpectedKeys) {
  std::mt19937_64 rng(7);
  Problem p = MakeProblem({70}, {70}, 1, 4, rng);
  std::vector<double> out(p.q.size());
  std::vector<double> lse(70);
  AttentionInputs in = p.Inputs(false);
  auto run = [&](AttentionOptions o) {
    ASSERT_TRUE(AttentionForward(in, o, MakeView(out.data(), DType::kFloat64, in.q.values.shape),
                                 MakeView(lse.data(), DType::kFloat64, {70, 1}))
                    .ok());
  };
  // A window of one key, and the first query under a causal mask, see only
  // their own value row.
  AttentionOptions window;
  window.mask = Mask::kSlidingWindow;
  window.window = 1;
  run(window);
  for (int64_t i = 0; i < 70 * 4; ++i) EXPECT_NEAR(out[i], p.v[i], 1e-12);
  EXPECT_NEAR(lse[69], 0.5 * [&] {
    double dot = 0;
    for (int c = 0; c < 4; ++c) dot += p.q[69 * 4 + c] * p.k[69 * 4 + c];
    return 2 * dot;
  }() / 2.0, 1e-12);  // lse of one key = its score (scale 1/sqrt(4) = 0.5)
  AttentionOptions causal;
  causal.mask = Mask::kCausal;
  run(causal);
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(out[c], p.v[c], 1e-12);
  // Block: query 64 (second block) is unaffected by keys of the first block.
  AttentionOptions block;
  block.mask = Mask::kBlock;
  run(block);
  const std::vector<double> before(out.begin() + 64 * 4, out.end());
  for (int64_t i = 0; i < 64 * 4; ++i) p.k[i] += 1.0;
  run(block);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(out[64 * 4 + i], before[i]);
}

TEST(AttentionForwardTest, EqualKeysAverageValuesAndEmptyRowsAreZero) {
  std::mt19937_64 rng(8);
  Problem p = MakeProblem({3, 2}, {5, 0}, 1, 4, rng);
  for (int64_t j = 1; j < 5; ++j) {
    for (int c = 0; c < 4; ++c) p.k[j * 4 + c] = p.k[c];
  }
  std::vector<double> out(p.q.size(), 99.0), lse(5, 99.0);
  AttentionInputs in = p.Inputs(false);
  ASSERT_TRUE(AttentionForward(in, {}, MakeView(out.data(), DType::kFloat64, in.q.values.shape),
                               MakeView(lse.data(), DType::kFloat64, {5, 1}))
                  .ok());
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 4; ++c) {
      double mean = 0;
      for (int j = 0; j < 5; ++j) mean += p.v[j * 4 + c] / 5;
      EXPECT_NEAR(out[i * 4 + c], mean, 1e-12);
    }
  }
  for (int i = 3 * 4; i < 5 * 4; ++i) EXPECT_EQ(out[i], 0.0);
  EXPECT_TRUE(std::isinf(lse[3]) && lse[3] < 0);
}

TEST(AttentionForwardTest, Bf16InputsMatchFloat64) {
  std::mt19937_64 rng(9);
  Problem p = MakeProblem({17, 40}, {33, 40}, 2, 8, rng);
  auto to_bf16 = [](const std::vector<double>& x) {
    std::vector<uint16_t> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float f = static_cast<float>(x[i]);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      y[i] = static_cast<uint16_t>(bits >> 16);  // truncation: exactly representable below
    }
    return y;
  };
  std::vector<uint16_t> q = to_bf16(p.q), k = to_bf16(p.k), v = to_bf16(p.v);
  // Make the float64 problem hold exactly the bf16 values.
  auto back = [](const std::vector<uint16_t>& x, std::vector<double>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      y[i] = f;
    }
  };
  back(q, p.q);
  back(k, p.k);
  back(v, p.v);
  AttentionOptions o;
  o.activation = Activation::kSilu;
  o.mask = Mask::kCausal;
  AttentionInputs in64 = p.Inputs(false);
  AttentionInputs in16 = in64;
  in16.q.values = MakeView(q.data(), DType::kBFloat16, in64.q.values.shape);
  in16.k.values = MakeView(k.data(), DType::kBFloat16, in64.k.values.shape);
  in16.v = MakeView(v.data(), DType::kBFloat16, in64.v.shape);
  std::vector<double> out64(p.q.size());
  std::vector<uint16_t> out16(p.q.size());
  ASSERT_TRUE(AttentionForward(in64, o, MakeView(out64.data(), DType::kFloat64,
                                                 in64.q.values.shape), {})
                  .ok());
  ASSERT_TRUE(AttentionForward(in16, o, MakeView(out16.data(), DType::kBFloat16,
                                                 in64.q.values.shape), {})
                  .ok());
  std::vector<double> out16d(out16.size());
  back(out16, out16d);
  for (size_t i = 0; i < out64.size(); ++i) {
    EXPECT_NEAR(out16d[i], out64[i], 1e-2 * (1 + std::abs(out64[i])));
  }
}

TEST(AttentionValidationTest, RejectsBadShapesWithClearMessages) {
  std::mt19937_64 rng(10);
  Problem p = MakeProblem({3}, {4}, 2, 8, rng);
  AttentionInputs in = p.Inputs(false);
  std::vector<double> out(p.q.size());
  TensorView out_view = MakeView(out.data(), DType::kFloat64, in.q.values.shape);
  AttentionOptions o;
  o.activation = Activation::kGelu;

  AttentionInputs bad = in;
  bad.v = MakeView(p.v.data(), DType::kFloat64, {4, 2, 4});
  absl::Status s = AttentionForward(bad, o, out_view, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("v dimension 2"), std::string::npos) << s;

  bad = in;
  bad.q.values.device = Device::kCuda;
  bad.k.values.device = Device::kCuda;
  bad.v.device = Device::kCuda;
  s = ValidateAttention(bad, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s;

  o.mask = Mask::kSlidingWindow;
  s = AttentionForward(in, o, out_view, {});
  EXPECT_NE(s.message().find("window"), std::string::npos) << s;

  o = AttentionOptions();
  s = AttentionForward(in, o, out_view, {});
  EXPECT_NE(s.message().find("lse must not be empty"), std::string::npos) << s;

  std::vector<double> bias(5);
  bad = in;
  bad.bias = MakeView(bias.data(), DType::kFloat64, {5});
  o.activation = Activation::kSilu;
  s = AttentionForward(bad, o, out_view, {});
  EXPECT_NE(s.message().find("bias must be fp64[24]"), std::string::npos) << s;
}

// The FP8 forward and backward are CUDA bf16 kernels at head dim 128 for
// softmax: anything else is refused by the option's name, the backward's
// before any gradient is written.
TEST(AttentionValidationTest, RejectsFp8WhereItCannotRun) {
  std::mt19937_64 rng(11);
  Problem p = MakeProblem({3}, {4}, 1, 128, rng);
  AttentionInputs in = p.Inputs(false);
  std::vector<double> out(p.q.size()), lse(3), dq(p.q.size(), 7.0), dk(p.k.size(), 7.0),
      dv(p.v.size(), 7.0);
  const TensorView out_view = MakeView(out.data(), DType::kFloat64, in.q.values.shape);
  const TensorView lse_view = MakeView(lse.data(), DType::kFloat64, {3, 1});
  AttentionOptions o;
  o.forward_precision = ForwardPrecision::kFp8E4M3;
  absl::Status s = AttentionForward(in, o, out_view, lse_view);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("forward_precision = kFp8E4M3 needs CUDA bf16"), std::string::npos) << s;

  o = AttentionOptions();
  ASSERT_TRUE(AttentionForward(in, o, out_view, lse_view).ok());
  o.backward_precision = BackwardPrecision::kFp8E4M3;
  AttentionGrads g;
  g.dq = MakeView(dq.data(), DType::kFloat64, in.q.values.shape);
  g.dk = MakeView(dk.data(), DType::kFloat64, in.k.values.shape);
  g.dv = MakeView(dv.data(), DType::kFloat64, in.v.shape);
  s = AttentionBackward(in, o, out_view, lse_view, out_view, g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("backward_precision = kFp8E4M3 needs CUDA bf16"), std::string::npos)
      << s;
  for (double x : dq) ASSERT_EQ(x, 7.0);
  for (double x : dv) ASSERT_EQ(x, 7.0);
}

TEST(AttentionFlopsTest, CountsVisiblePairs) {
  std::vector<int64_t> qo{0, 3, 3}, ko{0, 3, 5};
  JaggedView q, k;
  q.offsets = MakeView(qo.data(), DType::kInt64, {3});
  k.offsets = MakeView(ko.data(), DType::kInt64, {3});
  AttentionOptions o;
  EXPECT_EQ(AttentionForwardFlops(q, k, 2, 8, o), 9 * 4 * 8 * 2);
  o.mask = Mask::kCausal;
  EXPECT_EQ(AttentionForwardFlops(q, k, 2, 8, o), 6 * 4 * 8 * 2);
}

}  // namespace
}  // namespace recfleet::attention
