#include "kernels/ops/grad_clip.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "kernels/ops/check.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {

absl::Status GradClipScale(const TensorView& sum_sq, double max_norm, const TensorView& scale,
                           void* stream) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient clipping needs a finite max_norm > 0, got ", max_norm));
  }
  RECFLEET_RETURN_IF_ERROR(CheckFloat(sum_sq, "gradient clipping sum of squares"));
  RECFLEET_RETURN_IF_ERROR(CheckFloat(scale, "gradient clipping scale"));
  if (sum_sq.numel() < 1 || scale.numel() != 1 || scale.dtype != sum_sq.dtype ||
      scale.device != sum_sq.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient clipping takes one or more parts of the squared norm and a one-element scale of "
        "their dtype and device, got ",
        sum_sq.DebugString(), " and ", scale.DebugString()));
  }
  if (sum_sq.device == Device::kCuda) {
    return CudaStatus(ops_cuda::GradClipScale(sum_sq.as<const float>(), sum_sq.numel(), max_norm,
                                              scale.as<float>(), stream),
                      "gradient clipping scale");
  }
  const bool fp64 = sum_sq.dtype == DType::kFloat64;
  double sum = 0;
  for (int64_t i = 0; i < sum_sq.numel(); ++i) {
    sum += fp64 ? sum_sq.as<const double>()[i] : sum_sq.as<const float>()[i];
  }
  const double ratio = max_norm / (std::sqrt(sum) + 1e-6);
  // std::min would drop a NaN ratio; clip_grad_norm_'s clamp keeps it.
  const double s = std::isnan(ratio) || ratio < 1.0 ? ratio : 1.0;
  if (fp64) {
    scale.as<double>()[0] = s;
  } else {
    scale.as<float>()[0] = static_cast<float>(s);
  }
  return absl::OkStatus();
}

}  // namespace recfleet
