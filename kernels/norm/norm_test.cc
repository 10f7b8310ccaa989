#include "kernels/norm/norm.h"

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

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Float64 finite-difference check of dx, dgamma (and dbeta) for
// L = <norm(x), R>, on a [2, 3, dim] input (leading dims flatten to rows).
void CheckGradients(bool layer_norm, int64_t dim) {
  const int64_t rows = 6;
  const float eps = 1e-5f;
  std::vector<double> x = RandomDoubles(rows * dim, -2, 2), gamma = RandomDoubles(dim, 0.5, 1.5),
                      beta = RandomDoubles(dim), r = RandomDoubles(rows * dim);
  std::vector<double> y(rows * dim), mean(rows), rstd(rows);
  auto forward = [&](std::vector<double>& xx, std::vector<double>& gg, std::vector<double>& bb) {
    absl::Status s = layer_norm ? LayerNormForward(V(xx, {2, 3, dim}), V(gg, {dim}), V(bb, {dim}),
                                                   eps, V(y, {2, 3, dim}), V(mean, {rows}),
                                                   V(rstd, {rows}))
                                : RmsNormForward(V(xx, {2, 3, dim}), V(gg, {dim}), eps,
                                                 V(y, {2, 3, dim}), V(rstd, {rows}));
    EXPECT_TRUE(s.ok()) << s;
    return Dot(y, r);
  };
  forward(x, gamma, beta);
  std::vector<double> dx(rows * dim), dgamma(dim), dbeta(dim);
  absl::Status s =
      layer_norm
          ? LayerNormBackward(V(r, {2, 3, dim}), V(x, {2, 3, dim}), V(gamma, {dim}),
                              V(mean, {rows}), V(rstd, {rows}), V(dx, {2, 3, dim}),
                              V(dgamma, {dim}), V(dbeta, {dim}))
          : RmsNormBackward(V(r, {2, 3, dim}), V(x, {2, 3, dim}), V(gamma, {dim}), V(rstd, {rows}),
                            V(dx, {2, 3, dim}), V(dgamma, {dim}));
  ASSERT_TRUE(s.ok()) << s;
  const double h = 1e-6;
  auto fd = [&](std::vector<double>& p, int64_t i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = forward(x, gamma, beta);
    p[i] = keep - h;
    const double lm = forward(x, gamma, beta);
    p[i] = keep;
    return (lp - lm) / (2 * h);
  };
  // Relative tolerance: with tiny row variance (dim 2) gradients get large.
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-7 * std::max(1.0, std::fabs(b)); };
  for (int64_t i = 0; i < rows * dim; ++i) EXPECT_TRUE(near(dx[i], fd(x, i))) << "dx " << i;
  for (int64_t i = 0; i < dim; ++i) EXPECT_TRUE(near(dgamma[i], fd(gamma, i))) << "dgamma " << i;
  if (layer_norm) {
    for (int64_t i = 0; i < dim; ++i) EXPECT_TRUE(near(dbeta[i], fd(beta, i))) << "dbeta " << i;
  }
}

TEST(NormTest, RmsNormGradients) {
  CheckGradients(false, 1);
  CheckGradients(false, 13);
}

TEST(NormTest, LayerNormGradients) {
  CheckGradients(true, 2);
  CheckGradients(true, 13);
}

TEST(NormTest, ForwardNormalizesRows) {
  const int64_t rows = 4, dim = 33;
  std::vector<double> x = RandomDoubles(rows * dim, -3, 5), ones(dim, 1.0), zeros(dim, 0.0);
  std::vector<double> y(rows * dim), mean(rows), rstd(rows);
  ASSERT_TRUE(LayerNormForward(V(x, {rows, dim}), V(ones, {dim}), V(zeros, {dim}), 1e-12f,
                               V(y, {rows, dim}), V(mean, {rows}), V(rstd, {rows}))
                  .ok());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t d = 0; d < dim; ++d) m += y[r * dim + d];
    for (int64_t d = 0; d < dim; ++d) v += y[r * dim + d] * y[r * dim + d];
    EXPECT_NEAR(m / dim, 0, 1e-12);
    EXPECT_NEAR(v / dim, 1, 1e-9);
  }
  ASSERT_TRUE(RmsNormForward(V(x, {rows, dim}), V(ones, {dim}), 1e-12f, V(y, {rows, dim}),
                             V(rstd, {rows}))
                  .ok());
  for (int64_t r = 0; r < rows; ++r) {
    double v = 0;
    for (int64_t d = 0; d < dim; ++d) v += y[r * dim + d] * y[r * dim + d];
    EXPECT_NEAR(v / dim, 1, 1e-9);
  }
}

// The FP8 output dequantizes to the exact norm within half an E4M3 ulp
// (relative 2^-4) plus the subnormal step of its block.
TEST(NormTest, Fp8OutputDequantizesToTheNorm) {
  const int64_t rows = 5, dim = 300;  // a partial last 1x128 block
  std::vector<double> x = RandomDoubles(rows * dim, -3, 3), gamma = RandomDoubles(dim, 0.5, 2),
                      beta = RandomDoubles(dim), y(rows * dim), mean(rows), rstd(rows);
  std::vector<uint8_t> q(rows * dim);
  std::vector<float> scales(rows * 3);
  for (bool layer_norm : {false, true}) {
    absl::Status s =
        layer_norm
            ? LayerNormForward(V(x, {rows, dim}), V(gamma, {dim}), V(beta, {dim}), 1e-6f,
                               V(y, {rows, dim}), V(mean, {rows}), V(rstd, {rows}))
            : RmsNormForward(V(x, {rows, dim}), V(gamma, {dim}), 1e-6f, V(y, {rows, dim}),
                             V(rstd, {rows}));
    ASSERT_TRUE(s.ok()) << s;
    const TensorView qv = MakeView(q.data(), DType::kFloat8E4M3, {rows, dim});
    const TensorView sv = MakeView(scales.data(), DType::kFloat32, {rows, 3});
    s = layer_norm ? LayerNormForwardFp8(V(x, {rows, dim}), V(gamma, {dim}), V(beta, {dim}), 1e-6f,
                                         qv, sv, V(mean, {rows}), V(rstd, {rows}))
                   : RmsNormForwardFp8(V(x, {rows, dim}), V(gamma, {dim}), 1e-6f, qv, sv,
                                       V(rstd, {rows}));
    ASSERT_TRUE(s.ok()) << s;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < dim; ++d) {
        const double scale = scales[r * 3 + d / 128];
        const double got = LoadAsDouble(qv, r * dim + d) * scale;
        const double want = y[r * dim + d];
        ASSERT_LE(std::fabs(got - want), std::fabs(want) / 16 + scale * std::ldexp(1.0, -10))
            << r << "," << d;
      }
    }
  }
}

TEST(NormTest, RejectsMismatchedShapes) {
  std::vector<double> x(12), g(4), y(12), rstd(3);
  absl::Status s = RmsNormForward(V(x, {3, 4}), V(g, {3}), 1e-5f, V(y, {3, 4}), V(rstd, {3}));
  EXPECT_NE(s.message().find("gamma"), std::string::npos) << s;
  s = RmsNormForward(V(x, {3, 4}), V(g, {4}), 1e-5f, V(y, {4, 3}), V(rstd, {3}));
  EXPECT_NE(s.message().find("y must have the shape"), std::string::npos) << s;
  s = RmsNormForward(V(x, {3, 4}), V(g, {4}), 1e-5f, V(y, {3, 4}), V(rstd, {2}));
  EXPECT_NE(s.message().find("rstd"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet
