#include "engine/tensor.h"

#include <utility>

#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

TEST(TensorTest, ZerosOwnsAlignedStorageAndMoves) {
  absl::StatusOr<Tensor> t = Tensor::Zeros(DType::kFloat32, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->numel(), 15);
  EXPECT_EQ(t->nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data<float>()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t->data<float>()[i], 0.0f);
  t->data<float>()[7] = 2.5f;
  Tensor moved = *std::move(t);
  EXPECT_EQ(moved.data<float>()[7], 2.5f);
  EXPECT_EQ(moved.view().DebugString(), "fp32[3, 5] on cpu");
  absl::StatusOr<Tensor> copy = moved.Clone();
  ASSERT_TRUE(copy.ok());
  EXPECT_NE(copy->data<float>(), moved.data<float>());
  EXPECT_EQ(copy->data<float>()[7], 2.5f);
  ASSERT_TRUE(moved.SetZero().ok());
  EXPECT_EQ(moved.data<float>()[7], 0.0f);
}

TEST(TensorTest, EveryDTypeAndEmptyShapes) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3,
                  DType::kFloat8E5M2, DType::kInt32, DType::kInt64, DType::kFloat64}) {
    absl::StatusOr<Tensor> t = Tensor::Zeros(d, {4, 0});
    ASSERT_TRUE(t.ok()) << DTypeName(d);
    EXPECT_EQ(t->numel(), 0);
    EXPECT_FALSE(t->empty());
  }
  EXPECT_FALSE(Tensor::Empty(DType::kFloat32, {2, -1}).ok());
}

TEST(JaggedTensorTest, OffsetsFromLengthsIncludingEmptyRows) {
  absl::StatusOr<JaggedTensor> j = JaggedTensor::FromLengths(DType::kFloat32, {2, 0, 3, 1}, {8});
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->batch_size(), 4);
  EXPECT_EQ(j->total_length(), 6);
  EXPECT_EQ(j->offset(2), 2);
  EXPECT_EQ(j->length(1), 0);
  EXPECT_EQ(j->values().view().DebugString(), "fp32[6, 8] on cpu");
  EXPECT_TRUE(CheckJagged(j->view(), "history").ok());
  EXPECT_FALSE(JaggedTensor::FromLengths(DType::kFloat32, {1, -1}, {}).ok());
}

}  // namespace
}  // namespace recfleet::engine
