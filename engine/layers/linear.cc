#include "engine/layers/linear.h"

#include <cmath>

#include "engine/layers/ops.h"
#include "kernels/gemm/linear.h"
#include "kernels/norm/norm.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {

Linear::Linear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out,
               bool bias)
    : ctx_(ctx), in_(in), out_(out), has_bias_(bias) {
  ctx.parameters->Register(&w_, name + ".w", {out, in},
                           ParameterInit{1.0 / std::sqrt(static_cast<double>(in)), 0.0});
  if (bias) ctx.parameters->Register(&b_, name + ".b", {out}, ParameterInit{});
}

absl::Status Linear::Forward(const TensorView& x, Tensor* y) {
  const ScopedPhase phase(ctx_.phases, Phase::kGemm);
  const int64_t rows = x.dim(0);
  x_ = x;
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows, out_}, y));
  // The kernels reject empty matrices, and there is nothing to compute.
  if (rows == 0) return absl::OkStatus();
  if (ctx_.flops != nullptr) ctx_.flops->linear += 2.0 * rows * in_ * out_;
  return LinearForward(Reshaped(x, {rows, in_}), w_.value.view(),
                       has_bias_ ? b_.value.view() : TensorView(), y->view(), ctx_.recipe);
}

absl::Status Linear::Backward(const TensorView& dy, const TensorView& dx, bool accumulate) {
  const ScopedPhase phase(ctx_.phases, Phase::kGemm);
  const int64_t rows = x_.dim(0);
  if (rows == 0) return absl::OkStatus();
  const TensorView dy2 = Reshaped(dy, {rows, out_});
  RECFLEET_RETURN_IF_ERROR(LinearBackwardWeight(dy2, Reshaped(x_, {rows, in_}), w_.grad.view(),
                                                has_bias_ ? b_.grad.view() : TensorView(),
                                                /*accumulate=*/true, ctx_.recipe));
  if (dx.data == nullptr) return absl::OkStatus();
  if (!accumulate) {
    return LinearBackwardInput(dy2, w_.value.view(), Reshaped(dx, {rows, in_}), ctx_.recipe);
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows, in_}, &dx_scratch_));
  RECFLEET_RETURN_IF_ERROR(LinearBackwardInput(dy2, w_.value.view(), dx_scratch_.view(), ctx_.recipe));
  return ops::Add(dx, dx_scratch_.view(), dx);
}

RmsNorm::RmsNorm(const LayerContext& ctx, const std::string& name, int64_t dim)
    : ctx_(ctx), dim_(dim) {
  ctx.parameters->Register(&gamma_, name, {dim}, ParameterInit{0.0, 1.0});
}

absl::Status RmsNorm::Forward(const TensorView& x, Tensor* y) {
  const int64_t rows = x.dim(0);
  x_ = x;
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows, dim_}, y));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows}, &rstd_));
  if (rows == 0) return absl::OkStatus();
  return RmsNormForward(Reshaped(x, {rows, dim_}), gamma_.value.view(), kEpsilon, y->view(),
                        rstd_.view());
}

absl::Status RmsNorm::Backward(const TensorView& dy, const TensorView& dx) {
  const int64_t rows = x_.dim(0);
  if (rows == 0) return absl::OkStatus();
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {dim_}, &dgamma_));
  RECFLEET_RETURN_IF_ERROR(RmsNormBackward(Reshaped(dy, {rows, dim_}), Reshaped(x_, {rows, dim_}),
                                           gamma_.value.view(), rstd_.view(),
                                           Reshaped(dx, {rows, dim_}), dgamma_.view()));
  return ops::Add(gamma_.grad.view(), dgamma_.view(), gamma_.grad.view());
}

}  // namespace recfleet::engine::layers
