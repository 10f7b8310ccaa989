#include "engine/layers/dcn.h"

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {

Dcn::Dcn(const LayerContext& ctx, const std::string& name, int layers, int64_t width)
    : ctx_(ctx), width_(width) {
  for (int c = 0; c < layers; ++c) {
    cross_.push_back(std::make_unique<Linear>(ctx, absl::StrCat(name, c), width, width, true));
  }
  x_.resize(layers > 0 ? layers - 1 : 0);
  u_.resize(layers);
}

absl::Status Dcn::Forward(const TensorView& x0, Tensor* y) {
  x0_ = x0;
  const Shape shape = {x0.dim(0), width_};
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape, y));
  if (cross_.empty()) return ops::Copy(x0, y->view());
  for (size_t c = 0; c < cross_.size(); ++c) {
    const TensorView in = c == 0 ? x0 : x_[c - 1].view();
    Tensor* next = c + 1 == cross_.size() ? y : &x_[c];
    RECFLEET_RETURN_IF_ERROR(cross_[c]->Forward(in, &u_[c]));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape, next));
    RECFLEET_RETURN_IF_ERROR(ops::MulAdd(x0, u_[c].view(), in, next->view()));
  }
  return absl::OkStatus();
}

absl::Status Dcn::Backward(const TensorView& dy, const TensorView& dx0) {
  const Shape shape = {x0_.dim(0), width_};
  RECFLEET_RETURN_IF_ERROR(ops::Zero(dx0));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape, &dx_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape, &du_));
  RECFLEET_RETURN_IF_ERROR(ops::Copy(dy, dx_.view()));
  // dx_ is the gradient of x_{c+1}; it becomes that of x_c.
  for (int c = static_cast<int>(cross_.size()) - 1; c >= 0; --c) {
    RECFLEET_RETURN_IF_ERROR(ops::Mul(dx_.view(), x0_, du_.view()));
    RECFLEET_RETURN_IF_ERROR(ops::AddMul(dx_.view(), u_[c].view(), dx0));
    RECFLEET_RETURN_IF_ERROR(cross_[c]->Backward(du_.view(), dx_.view(), true));
  }
  return ops::Add(dx0, dx_.view(), dx0);
}

}  // namespace recfleet::engine::layers
