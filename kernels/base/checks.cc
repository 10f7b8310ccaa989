#include "kernels/base/checks.h"

#include "absl/strings/str_cat.h"

namespace recfleet {

absl::Status CheckComputeDType(const TensorView& t, absl::string_view what) {
  if (t.device == Device::kCpu) {
    return CheckDType(t, what, {DType::kFloat32, DType::kBFloat16, DType::kFloat64});
  }
  return CheckDType(t, what, {DType::kFloat32, DType::kBFloat16});
}

absl::Status CheckSameShape(const TensorView& t, absl::string_view what, const TensorView& ref,
                            absl::string_view ref_what) {
  if (t.device == ref.device && t.shape == ref.shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " must have the shape and device of ",
                                                 ref_what, " (", ref.DebugString(), "), got ",
                                                 t.DebugString()));
}

}  // namespace recfleet
