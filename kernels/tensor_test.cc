#include "kernels/tensor.h"

#include <vector>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

TEST(TensorViewTest, SizesAndNames) {
  std::vector<float> buf(24);
  TensorView v = MakeView(buf.data(), DType::kFloat32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96u);
  EXPECT_EQ(v.dim(-1), 4);
  EXPECT_EQ(v.DebugString(), "fp32[2, 3, 4] on cpu");
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat8E4M3), 1u);
}

TEST(TensorViewTest, CheckersNameTheTensor) {
  std::vector<float> buf(6);
  TensorView v = MakeView(buf.data(), DType::kFloat32, {2, 3});
  EXPECT_TRUE(CheckDType(v, "q", {DType::kFloat32}).ok());
  absl::Status s = CheckDType(v, "q", {DType::kBFloat16, DType::kFloat16});
  EXPECT_EQ(s.message(), "q must be bf16 or fp16, got fp32[2, 3] on cpu");
  EXPECT_FALSE(CheckRank(v, "k", 3).ok());
  EXPECT_FALSE(CheckDim(v, "k", 1, 4).ok());
  EXPECT_TRUE(CheckDim(v, "k", 1, 3).ok());
}

TEST(JaggedViewTest, ValidatesOffsets) {
  std::vector<float> values(5 * 2);
  std::vector<int32_t> good = {0, 2, 2, 5};
  JaggedView j{MakeView(values.data(), DType::kFloat32, {5, 2}),
               MakeView(good.data(), DType::kInt32, {4})};
  EXPECT_TRUE(CheckJagged(j, "x").ok());
  EXPECT_EQ(j.batch_size(), 3);
  EXPECT_EQ(j.length(1), 0);
  EXPECT_EQ(j.length(2), 3);

  std::vector<int64_t> decreasing = {0, 3, 2, 5};
  j.offsets = MakeView(decreasing.data(), DType::kInt64, {4});
  EXPECT_NE(CheckJagged(j, "x").message().find("non-decreasing"), std::string::npos);

  std::vector<int64_t> short_end = {0, 1, 2, 4};
  j.offsets = MakeView(short_end.data(), DType::kInt64, {4});
  EXPECT_NE(CheckJagged(j, "x").message().find("x.offsets[3] must equal"), std::string::npos);
}

}  // namespace
}  // namespace recfleet
