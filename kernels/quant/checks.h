#ifndef RECFLEET_KERNELS_QUANT_CHECKS_H_
#define RECFLEET_KERNELS_QUANT_CHECKS_H_

// Validation shared by the kernel launchers of embedding, norm, gemm and
// quant, on top of the Check* helpers of kernels/tensor.h.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

// RECFLEET_RETURN_IF_ERROR(expr): returns the absl::Status `expr` from the
// enclosing function when it is not OK.
#define RECFLEET_RETURN_IF_ERROR(expr)         \
  do {                                         \
    const absl::Status _recfleet_s = (expr);   \
    if (!_recfleet_s.ok()) return _recfleet_s; \
  } while (0)

namespace recfleet {

// A tensor the kernels compute on: fp32 or bf16 on any device, and fp64 on
// the CPU (exact references and gradient checks).
absl::Status CheckComputeDType(const TensorView& t, absl::string_view what);

// Same dtype, device and shape as `ref` (named `ref_what` in the message).
absl::Status CheckSameShape(const TensorView& t, absl::string_view what, const TensorView& ref,
                            absl::string_view ref_what);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_QUANT_CHECKS_H_
