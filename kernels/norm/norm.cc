#include "kernels/norm/norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/norm/norm_internal.h"
#include "kernels/quant/quantize.h"

namespace recfleet {
namespace {

using norm_internal::NormArgs;

// Checks x and derives rows/dim from it.
absl::Status CheckInput(const TensorView& x, NormArgs* a) {
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(x, "x"));
  if (x.rank() < 1 || x.dim(-1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("x must have shape [..., dim] with dim >= 1, got ", x.DebugString()));
  }
  a->dim = x.dim(-1);
  a->rows = x.numel() / a->dim;
  return absl::OkStatus();
}

absl::Status CheckVector(const TensorView& t, absl::string_view what, const TensorView& x,
                         int64_t n) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, x.device));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(t, what));
  RECFLEET_RETURN_IF_ERROR(CheckRank(t, what, 1));
  return CheckDim(t, what, 0, n);
}

// Statistics and parameter gradients: fp32, or fp64 on the CPU.
absl::Status CheckStat(const TensorView& t, absl::string_view what, const TensorView& x,
                       int64_t n) {
  RECFLEET_RETURN_IF_ERROR(CheckVector(t, what, x, n));
  if (t.dtype == DType::kBFloat16) return CheckDType(t, what, {DType::kFloat32, DType::kFloat64});
  return absl::OkStatus();
}

absl::Status CheckLike(const TensorView& t, absl::string_view what, const TensorView& x) {
  RECFLEET_RETURN_IF_ERROR(CheckSameShape(t, what, x, "x"));
  return CheckComputeDType(t, what);
}

absl::Status CheckFp8Output(const TensorView& y, const TensorView& y_scales, const TensorView& x,
                            const NormArgs& a) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(y, "y", x.device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(y, "y", {DType::kFloat8E4M3, DType::kFloat8E5M2}));
  if (y.shape != x.shape) {
    return absl::InvalidArgumentError(absl::StrCat("y must have the shape of x (",
                                                   x.DebugString(), "), got ", y.DebugString()));
  }
  RECFLEET_RETURN_IF_ERROR(CheckDevice(y_scales, "y_scales", x.device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(y_scales, "y_scales", {DType::kFloat32}));
  const Shape want = QuantScaleShape(a.rows, a.dim, ScaleBlock::k1x128);
  if (y_scales.shape != want) {
    return absl::InvalidArgumentError(absl::StrCat("y_scales must be fp32[", want[0], ", ",
                                                   want[1], "], got ", y_scales.DebugString()));
  }
  return absl::OkStatus();
}

// y_scales.data != nullptr selects the FP8 output.
absl::Status Forward(bool layer_norm, const TensorView& x, const TensorView& gamma,
                     const TensorView& beta, float eps, const TensorView& y,
                     const TensorView& y_scales, const TensorView& mean, const TensorView& rstd,
                     void* stream) {
  NormArgs a;
  a.layer_norm = layer_norm;
  RECFLEET_RETURN_IF_ERROR(CheckInput(x, &a));
  RECFLEET_RETURN_IF_ERROR(CheckVector(gamma, "gamma", x, a.dim));
  if (layer_norm) {
    RECFLEET_RETURN_IF_ERROR(CheckVector(beta, "beta", x, a.dim));
    RECFLEET_RETURN_IF_ERROR(CheckStat(mean, "mean", x, a.rows));
  }
  if (y_scales.data != nullptr) {
    RECFLEET_RETURN_IF_ERROR(CheckFp8Output(y, y_scales, x, a));
  } else {
    RECFLEET_RETURN_IF_ERROR(CheckLike(y, "y", x));
  }
  RECFLEET_RETURN_IF_ERROR(CheckStat(rstd, "rstd", x, a.rows));
  if (!(eps > 0)) return absl::InvalidArgumentError(absl::StrCat("eps must be > 0, got ", eps));
  if (x.device == Device::kCpu) {
    return norm_internal::ForwardCpu(a, x, gamma, beta, eps, y, y_scales, mean, rstd);
  }
  return norm_internal::ForwardCuda(a, x, gamma, beta, eps, y, y_scales, mean, rstd, stream);
}

absl::Status Backward(bool layer_norm, const TensorView& dy, const TensorView& x,
                      const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                      const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta,
                      void* stream) {
  NormArgs a;
  a.layer_norm = layer_norm;
  RECFLEET_RETURN_IF_ERROR(CheckInput(x, &a));
  RECFLEET_RETURN_IF_ERROR(CheckLike(dy, "dy", x));
  RECFLEET_RETURN_IF_ERROR(CheckLike(dx, "dx", x));
  RECFLEET_RETURN_IF_ERROR(CheckVector(gamma, "gamma", x, a.dim));
  RECFLEET_RETURN_IF_ERROR(CheckStat(rstd, "rstd", x, a.rows));
  RECFLEET_RETURN_IF_ERROR(CheckStat(dgamma, "dgamma", x, a.dim));
  if (layer_norm) {
    RECFLEET_RETURN_IF_ERROR(CheckStat(mean, "mean", x, a.rows));
    RECFLEET_RETURN_IF_ERROR(CheckStat(dbeta, "dbeta", x, a.dim));
  }
  if (x.device == Device::kCpu) {
    return norm_internal::BackwardCpu(a, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  }
  return norm_internal::BackwardCuda(a, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, stream);
}

}  // namespace

absl::Status RmsNormForward(const TensorView& x, const TensorView& gamma, float eps,
                            const TensorView& y, const TensorView& rstd, void* stream) {
  return Forward(false, x, gamma, TensorView(), eps, y, TensorView(), TensorView(), rstd, stream);
}

absl::Status RmsNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& rstd, const TensorView& dx,
                             const TensorView& dgamma, void* stream) {
  return Backward(false, dy, x, gamma, TensorView(), rstd, dx, dgamma, TensorView(), stream);
}

absl::Status LayerNormForward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                              float eps, const TensorView& y, const TensorView& mean,
                              const TensorView& rstd, void* stream) {
  return Forward(true, x, gamma, beta, eps, y, TensorView(), mean, rstd, stream);
}

absl::Status RmsNormForwardFp8(const TensorView& x, const TensorView& gamma, float eps,
                               const TensorView& y, const TensorView& y_scales,
                               const TensorView& rstd, void* stream) {
  if (y_scales.data == nullptr) return absl::InvalidArgumentError("y_scales must be set");
  return Forward(false, x, gamma, TensorView(), eps, y, y_scales, TensorView(), rstd, stream);
}

absl::Status LayerNormForwardFp8(const TensorView& x, const TensorView& gamma,
                                 const TensorView& beta, float eps, const TensorView& y,
                                 const TensorView& y_scales, const TensorView& mean,
                                 const TensorView& rstd, void* stream) {
  if (y_scales.data == nullptr) return absl::InvalidArgumentError("y_scales must be set");
  return Forward(true, x, gamma, beta, eps, y, y_scales, mean, rstd, stream);
}

absl::Status LayerNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                               const TensorView& mean, const TensorView& rstd,
                               const TensorView& dx, const TensorView& dgamma,
                               const TensorView& dbeta, void* stream) {
  return Backward(true, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, stream);
}

}  // namespace recfleet
