#ifndef RECFLEET_KERNELS_BASE_CHECKS_H_
#define RECFLEET_KERNELS_BASE_CHECKS_H_

// Validation shared by the kernel launchers of embedding, norm, gemm and
// quant, on top of the Check* helpers of kernels/tensor.h. Launchers chain
// these checks with RECFLEET_RETURN_IF_ERROR, so this header brings it.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/tensor.h"

namespace recfleet {

// A tensor the kernels compute on: fp32 or bf16 on any device, and fp64 on
// the CPU (exact references and gradient checks).
absl::Status CheckComputeDType(const TensorView& t, absl::string_view what);

// Same dtype, device and shape as `ref` (named `ref_what` in the message).
absl::Status CheckSameShape(const TensorView& t, absl::string_view what, const TensorView& ref,
                            absl::string_view ref_what);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_CHECKS_H_
