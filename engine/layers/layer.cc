#include "engine/layers/layer.h"

#include <utility>

namespace recfleet::engine::layers {

absl::Status AllocateTensor(const LayerContext& ctx, Shape shape, Tensor* t) {
  return AllocateTyped(ctx, ctx.dtype, std::move(shape), t);
}

absl::Status AllocateTyped(const LayerContext& ctx, DType dtype, Shape shape, Tensor* t) {
  if (!t->empty() && t->dtype() == dtype && t->shape() == shape &&
      t->device() == ctx.allocator->device()) {
    return absl::OkStatus();
  }
  absl::StatusOr<Tensor> fresh = Tensor::Empty(dtype, std::move(shape), ctx.allocator);
  if (!fresh.ok()) return fresh.status();
  *t = *std::move(fresh);
  return absl::OkStatus();
}

absl::Status AllocateZeros(const LayerContext& ctx, Shape shape, Tensor* t) {
  if (absl::Status s = AllocateTensor(ctx, std::move(shape), t); !s.ok()) return s;
  return t->SetZero();
}

TensorView Reshaped(const TensorView& t, Shape shape) {
  TensorView v = t;
  v.shape = std::move(shape);
  return v;
}

TensorView RowSlice(const TensorView& t, int64_t begin, int64_t end) {
  TensorView v = t;
  const int64_t row = t.dim(0) == 0 ? 0 : t.numel() / t.dim(0);
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(begin * row) * DTypeSize(t.dtype);
  v.shape[0] = end - begin;
  return v;
}

}  // namespace recfleet::engine::layers
