#include "kernels/gemm/linear.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"

namespace recfleet {
namespace {

TensorView V(std::vector<double>& v, Shape shape) {
  return MakeView(v.data(), DType::kFloat64, std::move(shape));
}

constexpr LinearRecipe kNative{GemmPrecision::kNative, GemmPrecision::kNative,
                               GemmPrecision::kNative};

// Float64 finite differences of L = <x W^T + b, R> for dx, dw and dbias.
TEST(LinearTest, GradientsMatchFiniteDifferences) {
  const int64_t m = 5, k = 7, n = 3;
  std::vector<double> x = RandomDoubles(m * k), w = RandomDoubles(n * k), b = RandomDoubles(n),
                      r = RandomDoubles(m * n), y(m * n);
  auto loss = [&] {
    EXPECT_TRUE(LinearForward(V(x, {m, k}), V(w, {n, k}), V(b, {n}), V(y, {m, n}), kNative).ok());
    double s = 0;
    for (int64_t i = 0; i < m * n; ++i) s += y[i] * r[i];
    return s;
  };
  std::vector<double> dx(m * k), dw(n * k), db(n);
  ASSERT_TRUE(LinearBackwardInput(V(r, {m, n}), V(w, {n, k}), V(dx, {m, k}), kNative).ok());
  ASSERT_TRUE(LinearBackwardWeight(V(r, {m, n}), V(x, {m, k}), V(dw, {n, k}), V(db, {n}), false,
                                   kNative)
                  .ok());
  const double h = 1e-6;
  auto fd = [&](std::vector<double>& p, int64_t i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = loss();
    p[i] = keep - h;
    const double lm = loss();
    p[i] = keep;
    return (lp - lm) / (2 * h);
  };
  for (int64_t i = 0; i < m * k; ++i) EXPECT_NEAR(dx[i], fd(x, i), 1e-8) << "dx " << i;
  for (int64_t i = 0; i < n * k; ++i) EXPECT_NEAR(dw[i], fd(w, i), 1e-8) << "dw " << i;
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(db[i], fd(b, i), 1e-8) << "db " << i;
}

TEST(LinearTest, WeightGradientAccumulates) {
  const int64_t m = 4, k = 3, n = 2;
  std::vector<double> x = RandomDoubles(m * k), dy = RandomDoubles(m * n);
  std::vector<double> once(n * k), twice(n * k), db1(n), db2(n);
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(once, {n, k}), V(db1, {n}),
                                   false, kNative)
                  .ok());
  for (bool acc : {false, true}) {
    ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(twice, {n, k}), V(db2, {n}),
                                     acc, kNative)
                    .ok());
  }
  for (int64_t i = 0; i < n * k; ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-14);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(db2[i], 2 * db1[i], 1e-14);
}

TEST(LinearTest, InputGradientAccumulates) {
  const int64_t m = 4, k = 3, n = 2;
  std::vector<double> dy = RandomDoubles(m * n), w = RandomDoubles(n * k);
  std::vector<double> once(m * k), acc = RandomDoubles(m * k);
  const std::vector<double> start = acc;
  ASSERT_TRUE(LinearBackwardInput(V(dy, {m, n}), V(w, {n, k}), V(once, {m, k}), kNative).ok());
  ASSERT_TRUE(
      LinearBackwardInputAccumulate(V(dy, {m, n}), V(w, {n, k}), V(acc, {m, k}), kNative).ok());
  for (int64_t i = 0; i < m * k; ++i) EXPECT_NEAR(acc[i], start[i] + once[i], 1e-12) << i;
}

TEST(LinearTest, Bf16RecipeRoundsOperandsOnly) {
  const int64_t m = 3, k = 40, n = 4;
  std::vector<double> x = RandomDoubles(m * k), w = RandomDoubles(n * k), y(m * n), want(m * n);
  ASSERT_TRUE(LinearForward(V(x, {m, k}), V(w, {n, k}), TensorView(), V(y, {m, n}), LinearRecipe())
                  .ok());
  for (double& v : x) v = RoundTo(DType::kBFloat16, v);
  for (double& v : w) v = RoundTo(DType::kBFloat16, v);
  ASSERT_TRUE(
      LinearForward(V(x, {m, k}), V(w, {n, k}), TensorView(), V(want, {m, n}), kNative).ok());
  for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(y[i], want[i], 1e-13);
}

// FP8 block GEMMs: every operand element carries at most half an E4M3 ulp
// of relative error (2^-4) plus a subnormal term, so each output is within
// sum_k |a_k||b_k| (2 * 2^-4 + 2^-8) + slack of the exact product.
TEST(LinearTest, Fp8BlockRecipeErrorIsBoundedForAllThreeGemms) {
  const int64_t m = 130, k = 260, n = 129;  // partial 128-blocks on every side
  std::vector<double> x = RandomDoubles(m * k), w = RandomDoubles(n * k), dy = RandomDoubles(m * n);
  const LinearRecipe fp8{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                         GemmPrecision::kFp8Block};
  auto check = [](const std::vector<double>& got, const std::vector<double>& exact,
                  const std::vector<double>& abs_dot, const char* what) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double bound = abs_dot[i] * (2.0 / 16 + 1.0 / 256) + 1e-3;
      ASSERT_LE(std::fabs(got[i] - exact[i]), bound) << what << " " << i;
      worst = std::max(worst, std::fabs(got[i] - exact[i]) / abs_dot[i]);
    }
    EXPECT_GT(worst, 0) << what << ": FP8 must actually round";
  };
  std::vector<double> ax(m * k), aw(n * k), ady(m * n);
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
  for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
  for (size_t i = 0; i < dy.size(); ++i) ady[i] = std::fabs(dy[i]);
  std::vector<double> y(m * n), ye(m * n), ya(m * n);
  ASSERT_TRUE(LinearForward(V(x, {m, k}), V(w, {n, k}), TensorView(), V(y, {m, n}), fp8).ok());
  ASSERT_TRUE(LinearForward(V(x, {m, k}), V(w, {n, k}), TensorView(), V(ye, {m, n}), kNative).ok());
  ASSERT_TRUE(LinearForward(V(ax, {m, k}), V(aw, {n, k}), TensorView(), V(ya, {m, n}), kNative).ok());
  check(y, ye, ya, "forward");
  std::vector<double> dx(m * k), dxe(m * k), dxa(m * k);
  ASSERT_TRUE(LinearBackwardInput(V(dy, {m, n}), V(w, {n, k}), V(dx, {m, k}), fp8).ok());
  ASSERT_TRUE(LinearBackwardInput(V(dy, {m, n}), V(w, {n, k}), V(dxe, {m, k}), kNative).ok());
  ASSERT_TRUE(LinearBackwardInput(V(ady, {m, n}), V(aw, {n, k}), V(dxa, {m, k}), kNative).ok());
  check(dx, dxe, dxa, "dgrad");
  std::vector<double> dw(n * k), dwe(n * k), dwa(n * k);
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(dw, {n, k}), TensorView(), false,
                                   fp8)
                  .ok());
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(dwe, {n, k}), TensorView(),
                                   false, kNative)
                  .ok());
  ASSERT_TRUE(LinearBackwardWeight(V(ady, {m, n}), V(ax, {m, k}), V(dwa, {n, k}), TensorView(),
                                   false, kNative)
                  .ok());
  check(dw, dwe, dwa, "wgrad");
}

double RelativeError(const std::vector<double>& got, const std::vector<double>& exact) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - exact[i]) * (got[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

// The wgrad options change how dy and x are quantized but not what is
// computed: the Hadamard transform along M cancels in dy^T x, and
// stochastic rounding is unbiased. Each result stays within FP8 error of the
// exact product, and each option really changes the rounding.
TEST(LinearTest, Fp8WgradOptionsKeepTheProduct) {
  const int64_t m = 256, k = 48, n = 40;
  std::vector<double> x = RandomDoubles(m * k), dy = RandomDoubles(m * n);
  std::vector<double> exact(n * k);
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(exact, {n, k}), TensorView(),
                                   false, kNative)
                  .ok());
  LinearRecipe r{GemmPrecision::kBf16, GemmPrecision::kBf16, GemmPrecision::kFp8Block};
  r.seed = TestRng()();
  std::vector<double> plain(n * k);
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(plain, {n, k}), TensorView(),
                                   false, r)
                  .ok());
  const double plain_err = RelativeError(plain, exact);
  EXPECT_LT(plain_err, 0.1);
  for (int option = 0; option < 3; ++option) {
    LinearRecipe o = r;
    o.wgrad_hadamard = option != 1;
    o.wgrad_stochastic = option != 0;
    std::vector<double> got(n * k);
    ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(got, {n, k}), TensorView(),
                                     false, o)
                    .ok());
    const double err = RelativeError(got, exact);
    EXPECT_LT(err, 0.1) << "option " << option;
    EXPECT_GT(RelativeError(got, plain), 1e-6) << "option " << option << " changed nothing";
  }
}

// The Hadamard + stochastic wgrad takes any M. M = 200 is one whole 128-row
// group and a partial one, completed with zero rows: the result equals that
// of explicitly zero-padded operands bit for bit. E4M3 keeps 3 mantissa
// bits, so an element's relative error is at most 2^-4 rounded to nearest
// (x) and below 2^-3 rounded stochastically (dy), and the errors of the
// 200-term sums mostly cancel: dW is within 6% (relative Frobenius error;
// 4.0-4.1% measured) of the exact product. The signs and the rounding
// change with the seed, unbiased, so the mean over 32 seeds is several
// times closer to the exact dW than one seed's result (sqrt(32) ~ 5.7x
// measured).
TEST(LinearTest, Fp8HadamardStochasticWgradTakesAnyRowCount) {
  const int64_t m = 200, padded_m = 256, n = 64, k = 96;
  std::vector<double> x = RandomDoubles(m * k), dy = RandomDoubles(m * n);
  std::vector<double> exact(n * k);
  ASSERT_TRUE(LinearBackwardWeight(V(dy, {m, n}), V(x, {m, k}), V(exact, {n, k}), TensorView(),
                                   false, kNative)
                  .ok());
  auto wgrad = [&](uint64_t seed, std::vector<double>& xs, std::vector<double>& dys) {
    LinearRecipe r{GemmPrecision::kBf16, GemmPrecision::kBf16, GemmPrecision::kFp8Block};
    r.wgrad_hadamard = r.wgrad_stochastic = true;
    r.seed = seed;
    const int64_t rows = static_cast<int64_t>(xs.size()) / k;
    std::vector<double> dw(n * k);
    const absl::Status s = LinearBackwardWeight(V(dys, {rows, n}), V(xs, {rows, k}),
                                                V(dw, {n, k}), TensorView(), false, r);
    EXPECT_TRUE(s.ok()) << s;
    return dw;
  };
  const uint64_t seed = TestRng()();
  const std::vector<double> one = wgrad(seed, x, dy);
  std::vector<double> padded_x = x, padded_dy = dy;
  padded_x.resize(padded_m * k, 0.0);
  padded_dy.resize(padded_m * n, 0.0);
  EXPECT_EQ(one, wgrad(seed, padded_x, padded_dy));
  const double err = RelativeError(one, exact);
  EXPECT_LT(err, 0.06);
  EXPECT_GT(RelativeError(wgrad(seed + 1, x, dy), one), 1e-3) << "the seed changed nothing";
  constexpr int kSeeds = 32;
  std::vector<double> mean(n * k, 0.0);
  double mean_err = 0;
  for (int i = 0; i < kSeeds; ++i) {
    const std::vector<double> dw = wgrad(seed + 100 + i, x, dy);
    mean_err += RelativeError(dw, exact) / kSeeds;
    for (int64_t j = 0; j < n * k; ++j) mean[j] += dw[j] / kSeeds;
  }
  EXPECT_LT(RelativeError(mean, exact), mean_err / 3);
}

TEST(LinearTest, RejectsMismatchedShapes) {
  std::vector<double> x(12), w(8), y(6);
  absl::Status s = LinearForward(V(x, {3, 4}), V(w, {2, 4}), TensorView(), V(y, {2, 3}), kNative);
  EXPECT_NE(s.message().find("y dimension 0"), std::string::npos) << s;
  s = LinearForward(V(x, {3, 4}), V(w, {4, 2}), TensorView(), V(y, {3, 2}), kNative);
  EXPECT_NE(s.message().find("w dimension 1"), std::string::npos) << s;
  s = LinearForward(V(x, {3, 4}), V(w, {2, 4}), V(y, {3}), V(y, {3, 2}), kNative);
  EXPECT_NE(s.message().find("bias"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet
