#include "kernels/embedding/embedding.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"

namespace recfleet {
namespace {

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Case {
  int64_t rows, dim;
  std::vector<int64_t> ids;
  std::vector<int64_t> offsets;  // empty: sequence lookup
  Pooling pooling = Pooling::kSum;
  int64_t lookups() const { return offsets.empty() ? ids.size() : offsets.size() - 1; }
};

TensorView View(std::vector<double>& v, Shape shape) {
  return MakeView(v.data(), DType::kFloat64, std::move(shape));
}

absl::Status RunForward(const Case& c, std::vector<double>& table, std::vector<double>& out) {
  std::vector<int64_t> ids = c.ids, offsets = c.offsets;
  TensorView t = View(table, {c.rows, c.dim});
  TensorView o = View(out, {c.lookups(), c.dim});
  TensorView iv = MakeView(ids.data(), DType::kInt64, {static_cast<int64_t>(ids.size())});
  if (c.offsets.empty()) return EmbeddingSequenceForward(t, iv, o);
  JaggedView j{iv, MakeView(offsets.data(), DType::kInt64, {static_cast<int64_t>(offsets.size())})};
  return EmbeddingBagForward(t, j, c.pooling, o);
}

absl::Status RunBackward(const Case& c, std::vector<double>& grad, const RowwiseAdagradConfig& cfg,
                         std::vector<double>& table, std::vector<double>& momentum) {
  std::vector<int64_t> ids = c.ids, offsets = c.offsets;
  TensorView t = View(table, {c.rows, c.dim});
  TensorView g = View(grad, {c.lookups(), c.dim});
  TensorView m = View(momentum, {c.rows});
  TensorView iv = MakeView(ids.data(), DType::kInt64, {static_cast<int64_t>(ids.size())});
  if (c.offsets.empty()) return EmbeddingSequenceBackwardAdagrad(g, iv, cfg, t, m);
  JaggedView j{iv, MakeView(offsets.data(), DType::kInt64, {static_cast<int64_t>(offsets.size())})};
  return EmbeddingBagBackwardAdagrad(g, j, c.pooling, cfg, t, m);
}

// Float64 finite-difference check of the fused backward. The loss is
// L = <forward(table), R>. One Adagrad step from a known accumulator m0 is
// invertible: m1 = m0 + mean(g^2) is stored, and
// g = (w0 - w1) * (sqrt(m1) + eps) / lr, so the gradient the kernel used can
// be recovered exactly and compared with central differences of L.
void CheckGradient(const Case& c) {
  std::vector<double> table = RandomDoubles(c.rows * c.dim);
  std::vector<double> r = RandomDoubles(c.lookups() * c.dim);
  std::vector<double> out(c.lookups() * c.dim);
  auto loss = [&](std::vector<double>& t) {
    EXPECT_TRUE(RunForward(c, t, out).ok());
    return Dot(out, r);
  };
  const RowwiseAdagradConfig cfg{0.5f, 1e-3f};
  std::vector<double> momentum = RandomDoubles(c.rows, 0.5, 2.0);
  std::vector<double> m0 = momentum, updated = table;
  ASSERT_TRUE(RunBackward(c, r, cfg, updated, momentum).ok());
  const double h = 1e-6;
  for (int64_t row = 0; row < c.rows; ++row) {
    double fd_sq = 0;
    for (int64_t d = 0; d < c.dim; ++d) {
      const int64_t k = row * c.dim + d;
      std::vector<double> t = table;
      t[k] += h;
      const double lp = loss(t);
      t[k] -= 2 * h;
      const double lm = loss(t);
      const double fd = (lp - lm) / (2 * h);
      fd_sq += fd * fd;
      const double used = (table[k] - updated[k]) * (std::sqrt(momentum[row]) + cfg.eps) /
                          cfg.learning_rate;
      EXPECT_NEAR(used, fd, 1e-7) << "row " << row << " col " << d;
    }
    // The accumulator grew by exactly the mean squared (deduplicated) gradient.
    EXPECT_NEAR(momentum[row] - m0[row], fd_sq / c.dim, 1e-8) << "row " << row;
  }
}

TEST(EmbeddingTest, BagSumGradientWithDuplicatesEmptyAndSingleBags) {
  // Bag 0 repeats id 3; id 1 appears in three bags; bag 2 is empty; bag 3
  // has one id; rows 0 and 6 are never looked up and must stay untouched.
  Case c{7, 5, {3, 1, 3, 5, 1, 2, 1, 4, 3}, {0, 3, 5, 5, 6, 9}, Pooling::kSum};
  CheckGradient(c);
}

TEST(EmbeddingTest, BagMeanGradient) {
  Case c{6, 4, {0, 0, 0, 2, 5, 2, 1}, {0, 3, 3, 4, 7}, Pooling::kMean};
  CheckGradient(c);
}

TEST(EmbeddingTest, SequenceGradientWithDuplicates) {
  Case c{5, 3, {4, 0, 4, 4, 2, 0}, {}, Pooling::kSum};
  CheckGradient(c);
}

TEST(EmbeddingTest, ForwardPoolsRowsAndEmptyBagIsZero) {
  Case c{4, 3, {1, 2, 2, 3}, {0, 0, 3, 4}, Pooling::kMean};
  std::vector<double> table = RandomDoubles(c.rows * c.dim), out(c.lookups() * c.dim, 7.0);
  ASSERT_TRUE(RunForward(c, table, out).ok());
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(out[d], 0.0);
    EXPECT_NEAR(out[3 + d], (table[3 + d] + 2 * table[6 + d]) / 3, 1e-15);
    EXPECT_EQ(out[6 + d], table[9 + d]);
  }
}

TEST(EmbeddingTest, AdagradStepMatchesFormula) {
  // One id, sum pooling, momentum 0: the classic first Adagrad step.
  Case c{2, 2, {1}, {0, 1}, Pooling::kSum};
  std::vector<double> table = {1, 2, 3, 4}, momentum = {0.25, 0}, grad = {0.3, -0.4};
  const RowwiseAdagradConfig cfg{0.1f, 1e-6f};
  ASSERT_TRUE(RunBackward(c, grad, cfg, table, momentum).ok());
  const double m = (0.09 + 0.16) / 2;
  EXPECT_DOUBLE_EQ(momentum[0], 0.25);
  EXPECT_DOUBLE_EQ(momentum[1], m);
  const double step = static_cast<double>(0.1f) / (std::sqrt(m) + static_cast<double>(1e-6f));
  EXPECT_DOUBLE_EQ(table[2], 3 - step * 0.3);
  EXPECT_DOUBLE_EQ(table[3], 4 + step * 0.4);
  EXPECT_EQ(table[0], 1);
}

TEST(EmbeddingTest, Int32IdsAndBf16TableMatchFloat64) {
  const int64_t rows = 50, dim = 16, batch = 8;
  std::vector<double> table = RandomDoubles(rows * dim);
  std::vector<uint16_t> table_bf16(rows * dim);
  for (size_t i = 0; i < table.size(); ++i) {
    table_bf16[i] = FloatToBFloat16(static_cast<float>(table[i]));
    table[i] = BFloat16ToFloat(table_bf16[i]);
  }
  std::uniform_int_distribution<int32_t> id(0, rows - 1), len(0, 6);
  std::vector<int32_t> ids, offsets = {0};
  for (int b = 0; b < batch; ++b) {
    const int n = len(TestRng());
    for (int i = 0; i < n; ++i) ids.push_back(id(TestRng()));
    offsets.push_back(static_cast<int32_t>(ids.size()));
  }
  std::vector<float> out(batch * dim);
  JaggedView j{MakeView(ids.data(), DType::kInt32, {static_cast<int64_t>(ids.size())}),
               MakeView(offsets.data(), DType::kInt32, {batch + 1})};
  ASSERT_TRUE(EmbeddingBagForward(MakeView(table_bf16.data(), DType::kBFloat16, {rows, dim}), j,
                                  Pooling::kSum, MakeView(out.data(), DType::kFloat32, {batch, dim}))
                  .ok());
  for (int b = 0; b < batch; ++b) {
    for (int d = 0; d < dim; ++d) {
      double want = 0;
      for (int i = offsets[b]; i < offsets[b + 1]; ++i) want += table[ids[i] * dim + d];
      EXPECT_NEAR(out[b * dim + d], want, 1e-6);
    }
  }
}

TEST(EmbeddingTest, RejectsBadInputsWithNamedFields) {
  std::vector<double> table(12), out(6);
  std::vector<int64_t> ids = {0, 9}, offsets = {0, 1, 2};
  JaggedView j{MakeView(ids.data(), DType::kInt64, {2}), MakeView(offsets.data(), DType::kInt64, {3})};
  absl::Status s = EmbeddingBagForward(View(table, {4, 3}), j, Pooling::kSum, View(out, {2, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ids[1] = 9"), std::string::npos) << s;
  ids[1] = 1;
  s = EmbeddingBagForward(View(table, {4, 3}), j, Pooling::kSum, View(out, {3, 2}));
  EXPECT_NE(s.message().find("out"), std::string::npos) << s;
  offsets[2] = 1;
  s = EmbeddingBagForward(View(table, {4, 3}), j, Pooling::kSum, View(out, {2, 3}));
  EXPECT_NE(s.message().find("ids.offsets"), std::string::npos) << s;
  std::vector<double> momentum(3);
  offsets[2] = 2;
  s = EmbeddingBagBackwardAdagrad(View(out, {2, 3}), j, Pooling::kSum, {}, View(table, {4, 3}),
                                  View(momentum, {3}));
  EXPECT_NE(s.message().find("momentum"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet
