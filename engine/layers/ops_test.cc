#include "engine/layers/ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/layers/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::engine::ops {
namespace {

using layers::TensorOf;
using layers::Values;
using ::testing::ElementsAre;

TEST(OpsTest, ElementwiseArithmetic) {
  Tensor a = TensorOf({3}, {1, 2, 3}), b = TensorOf({3}, {4, 5, 6}), c = TensorOf({3}, {1, 1, 2});
  Tensor out = TensorOf({3}, {0, 0, 0});
  ASSERT_TRUE(Add(a.view(), b.view(), out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(5, 7, 9));
  ASSERT_TRUE(MulAdd(a.view(), b.view(), c.view(), out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(5, 11, 20));
  ASSERT_TRUE(Mul(a.view(), b.view(), out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(4, 10, 18));
  ASSERT_TRUE(AddMul(a.view(), c.view(), out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(5, 12, 24));
  ASSERT_TRUE(AddScaled(a.view(), 0.5, out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(5.5, 13, 25.5));
  ASSERT_TRUE(Scale(out.view(), 2).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(11, 26, 51));
  ASSERT_TRUE(Zero(out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(0, 0, 0));
  // Aliased output: a += b.
  ASSERT_TRUE(Add(a.view(), b.view(), a.view()).ok());
  EXPECT_THAT(Values(a.view()), ElementsAre(5, 7, 9));
  ASSERT_TRUE(FillMeanWeights(out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(1.0 / 3, 1.0 / 3, 1.0 / 3));
}

TEST(OpsTest, ColumnBlocksAndRepeats) {
  // Two rows of width 2 into columns [1, 3) of width-4 rows, and back.
  Tensor src = TensorOf({2, 2}, {1, 2, 3, 4});
  Tensor dst = TensorOf({2, 4}, {0, 0, 0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(ScatterColumns(src.view(), 1, dst.view()).ok());
  EXPECT_THAT(Values(dst.view()), ElementsAre(0, 1, 2, 0, 0, 3, 4, 0));
  Tensor back = TensorOf({2, 1}, {0, 0});
  ASSERT_TRUE(GatherColumns(dst.view(), 2, back.view()).ok());
  EXPECT_THAT(Values(back.view()), ElementsAre(2, 4));
  EXPECT_EQ(ScatterColumns(src.view(), 3, dst.view()).code(), absl::StatusCode::kInvalidArgument);

  Tensor q = TensorOf({2}, {1, 2});
  Tensor rep = TensorOf({6}, {0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(RepeatRows(q.view(), 3, rep.view()).ok());
  EXPECT_THAT(Values(rep.view()), ElementsAre(1, 2, 1, 2, 1, 2));
  Tensor dq = TensorOf({2}, {10, 20});
  Tensor dy = TensorOf({6}, {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(AccumulateRepeats(dy.view(), dq.view()).ok());
  EXPECT_THAT(Values(dq.view()), ElementsAre(19, 32));
}

TEST(OpsTest, GateSoftmaxAndMixture) {
  // Row 0: logits 0, log 3 -> 1/4, 3/4. Row 1: equal logits (large, so the
  // max subtraction matters) -> 1/2, 1/2.
  Tensor logits = TensorOf({2, 2}, {0, std::log(3.0), 1000, 1000});
  Tensor p = TensorOf({2, 2}, {0, 0, 0, 0});
  ASSERT_TRUE(SoftmaxRows(logits.view(), p.view()).ok());
  EXPECT_NEAR(p.data<double>()[0], 0.25, 1e-15);
  EXPECT_NEAR(p.data<double>()[1], 0.75, 1e-15);
  EXPECT_EQ(p.data<double>()[2], 0.5);
  // Softmax backward: dx = p * (dy - <p, dy>).
  Tensor dy = TensorOf({2, 2}, {1, 0, 2, 4});
  Tensor dx = TensorOf({2, 2}, {0, 0, 0, 0});
  ASSERT_TRUE(SoftmaxRowsBackward(p.view(), dy.view(), dx.view()).ok());
  EXPECT_NEAR(dx.data<double>()[0], 0.25 * (1 - 0.25), 1e-15);
  EXPECT_NEAR(dx.data<double>()[1], 0.75 * (0 - 0.25), 1e-15);
  EXPECT_NEAR(dx.data<double>()[3], 0.5 * (4 - 3), 1e-15);

  // acc += p[:, 1] * x, and its backward.
  Tensor x = TensorOf({2, 2}, {4, 8, 2, 6});
  Tensor acc = TensorOf({2, 2}, {1, 1, 1, 1});
  ASSERT_TRUE(AddGated(p.view(), 1, x.view(), acc.view()).ok());
  EXPECT_THAT(Values(acc.view()), ElementsAre(4, 7, 2, 4));
  Tensor dacc = TensorOf({2, 2}, {1, 2, 3, 4});
  Tensor dgate = TensorOf({2, 2}, {-1, -1, -1, -1});
  ASSERT_TRUE(AddGatedBackward(p.view(), 1, x.view(), dacc.view(), dx.view(), dgate.view()).ok());
  EXPECT_THAT(Values(dx.view()), ElementsAre(0.75, 1.5, 1.5, 2));
  EXPECT_THAT(Values(dgate.view()), ElementsAre(-1, 20, -1, 30));
}

TEST(OpsTest, BagScaling) {
  // Bags of 2, 0 and 1 ids.
  std::vector<int64_t> off = {0, 2, 2, 3};
  const TensorView offsets = MakeView(off.data(), DType::kInt64, {4});
  Tensor sums = TensorOf({3, 2}, {2, 4, 6, 8, 10, 12});
  Tensor out = TensorOf({3, 2}, {0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(ScaleBags(sums.view(), offsets, Pooling::kMean, out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(1, 2, 6, 8, 10, 12));
  ASSERT_TRUE(ScaleBags(sums.view(), offsets, Pooling::kSum, out.view()).ok());
  EXPECT_THAT(Values(out.view()), ElementsAre(2, 4, 6, 8, 10, 12));
  Tensor rows = TensorOf({3, 2}, {0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(ExpandBags(sums.view(), offsets, Pooling::kMean, rows.view()).ok());
  EXPECT_THAT(Values(rows.view()), ElementsAre(1, 2, 1, 2, 10, 12));
  Tensor too_few = TensorOf({2, 2}, {0, 0, 0, 0});
  EXPECT_EQ(ExpandBags(sums.view(), offsets, Pooling::kSum, too_few.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OpsTest, HostTransfersAndErrors) {
  Tensor x = TensorOf({3}, {0, 0, 0});
  const std::vector<float> src = {0.5f, 1.5f, 2.0f};
  ASSERT_TRUE(CopyFromHost(src, x.view()).ok());
  EXPECT_THAT(*CopyToHost(x.view()), ElementsAre(0.5, 1.5, 2.0));
  EXPECT_EQ(*SumToHost(x.view()), 4.0);

  std::vector<float> f(3);
  const TensorView fp32 = MakeView(f.data(), DType::kFloat32, {3});
  EXPECT_EQ(Add(x.view(), fp32, x.view()).code(), absl::StatusCode::kInvalidArgument);
  // CUDA operands are fp32 and all on one device (checked before any launch).
  TensorView on_gpu = x.view();
  on_gpu.device = Device::kCuda;
  EXPECT_EQ(Add(on_gpu, on_gpu, on_gpu).code(), absl::StatusCode::kInvalidArgument);
  TensorView fp32_gpu = fp32;
  fp32_gpu.device = Device::kCuda;
  EXPECT_EQ(Add(fp32_gpu, fp32, fp32).code(), absl::StatusCode::kInvalidArgument);
  Tensor two = TensorOf({2}, {0, 0});
  EXPECT_EQ(Copy(x.view(), two.view()).code(), absl::StatusCode::kInvalidArgument);
  // bf16 operands are the CUDA engine's bf16 activation stream only.
  std::vector<uint16_t> h(3);
  const TensorView bf16 = MakeView(h.data(), DType::kBFloat16, {3});
  const absl::Status host_bf16 = Add(fp32, bf16, fp32);
  EXPECT_EQ(host_bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(host_bf16.message().find("bf16 operands are for CUDA"), std::string::npos) << host_bf16;
}

TEST(OpsTest, ScatterAddRowsSumsRowsPerSlot) {
  Tensor rows = TensorOf({3, 2}, {1, 2, 3, 4, 5, 6});
  std::vector<int64_t> slots = {1, 0, 1};
  Tensor out = TensorOf({2, 2}, {0, 0, 10, 10});
  const TensorView sv = MakeView(slots.data(), DType::kInt64, {3});
  ASSERT_TRUE(ScatterAddRows(rows.view(), sv, out.view()).ok());
  EXPECT_THAT(*CopyToHost(out.view()), ElementsAre(3, 4, 16, 18));
  slots[2] = 2;  // Outside out.
  EXPECT_EQ(ScatterAddRows(rows.view(), sv, out.view()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpsTest, ConvertAndIndices) {
  std::vector<float> x = {1.0f, -2.5f, 1.0f + 1.0f / 512, 3.14159f};
  std::vector<uint16_t> half(4);
  std::vector<float> back(4);
  const TensorView xv = MakeView(x.data(), DType::kFloat32, {4});
  const TensorView hv = MakeView(half.data(), DType::kBFloat16, {4});
  const TensorView bv = MakeView(back.data(), DType::kFloat32, {4});
  ASSERT_TRUE(Convert(xv, hv).ok());
  ASSERT_TRUE(Convert(hv, bv).ok());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_EQ(back[2], 1.0f);  // 8 bits of mantissa: the 2^-9 step rounds to even.
  EXPECT_NEAR(back[3], 3.14159f, 3.14159f / 256);
  EXPECT_NE(back[3], 3.14159f);
  EXPECT_EQ(Convert(xv, bv).code(), absl::StatusCode::kInvalidArgument);

  std::vector<int64_t> a = {5, 7, 9}, b(3);
  ASSERT_TRUE(CopyIndices(MakeView(a.data(), DType::kInt64, {3}), MakeView(b.data(), DType::kInt64, {3})).ok());
  EXPECT_EQ(b, a);
  EXPECT_EQ(CopyIndices(MakeView(a.data(), DType::kInt64, {3}), xv).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::engine::ops
