#include "kernels/ops/check.h"

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace {

absl::Status CheckStorage(const TensorView& t, absl::string_view what) {
  if (t.data == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has no storage: ", t.DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFloatCpu(const TensorView& t, absl::string_view what) {
  RECFLEET_RETURN_IF_ERROR(CheckDType(t, what, {DType::kFloat32, DType::kFloat64}));
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, Device::kCpu));
  return CheckStorage(t, what);
}

absl::Status CheckFloat(const TensorView& t, absl::string_view what, bool bf16_on_cuda) {
  if (t.device == Device::kCpu) return CheckFloatCpu(t, what);
  if (bf16_on_cuda) {
    RECFLEET_RETURN_IF_ERROR(CheckDType(t, what, {DType::kFloat32, DType::kBFloat16}));
  } else {
    RECFLEET_RETURN_IF_ERROR(CheckDType(t, what, {DType::kFloat32}));
  }
  return CheckStorage(t, what);
}

absl::Status CheckSameLayout(const TensorView& t, absl::string_view what, const TensorView& like) {
  if (t.dtype != like.dtype || t.device != like.device || t.shape != like.shape) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be ", like.DebugString(), ", got ",
                                                   t.DebugString()));
  }
  return CheckStorage(t, what);
}

}  // namespace recfleet
