#include "kernels/norm/norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/norm/norm_internal.h"
#include "kernels/quant/checks.h"

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

absl::Status Forward(bool layer_norm, const TensorView& x, const TensorView& gamma,
                     const TensorView& beta, float eps, const TensorView& y,
                     const TensorView& mean, const TensorView& rstd, void* stream) {
  NormArgs a;
  a.layer_norm = layer_norm;
  RECFLEET_RETURN_IF_ERROR(CheckInput(x, &a));
  RECFLEET_RETURN_IF_ERROR(CheckVector(gamma, "gamma", x, a.dim));
  if (layer_norm) {
    RECFLEET_RETURN_IF_ERROR(CheckVector(beta, "beta", x, a.dim));
    RECFLEET_RETURN_IF_ERROR(CheckStat(mean, "mean", x, a.rows));
  }
  RECFLEET_RETURN_IF_ERROR(CheckLike(y, "y", x));
  RECFLEET_RETURN_IF_ERROR(CheckStat(rstd, "rstd", x, a.rows));
  if (!(eps > 0)) return absl::InvalidArgumentError(absl::StrCat("eps must be > 0, got ", eps));
  if (x.device == Device::kCpu) return norm_internal::ForwardCpu(a, x, gamma, beta, eps, y, mean, rstd);
  return CheckDevice(x, "x", Device::kCpu);
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
  return CheckDevice(x, "x", Device::kCpu);
}

}  // namespace

absl::Status RmsNormForward(const TensorView& x, const TensorView& gamma, float eps,
                            const TensorView& y, const TensorView& rstd, void* stream) {
  return Forward(false, x, gamma, TensorView(), eps, y, TensorView(), rstd, stream);
}

absl::Status RmsNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& rstd, const TensorView& dx,
                             const TensorView& dgamma, void* stream) {
  return Backward(false, dy, x, gamma, TensorView(), rstd, dx, dgamma, TensorView(), stream);
}

absl::Status LayerNormForward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                              float eps, const TensorView& y, const TensorView& mean,
                              const TensorView& rstd, void* stream) {
  return Forward(true, x, gamma, beta, eps, y, mean, rstd, stream);
}

absl::Status LayerNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                               const TensorView& mean, const TensorView& rstd,
                               const TensorView& dx, const TensorView& dgamma,
                               const TensorView& dbeta, void* stream) {
  return Backward(true, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, stream);
}

}  // namespace recfleet
