#ifndef RECFLEET_KERNELS_OPS_CHECK_H_
#define RECFLEET_KERNELS_OPS_CHECK_H_

// Validation shared by the elementwise ops' launchers (internal to
// kernels/ops).

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

#define RECFLEET_OPS_RETURN_IF_ERROR(expr)      \
  do {                                          \
    if (absl::Status s_ = (expr); !s_.ok()) {   \
      return s_;                                \
    }                                           \
  } while (false)

namespace recfleet::kernels {

// `t` is fp32 or fp64, on the CPU (the only device these launchers run on
// until the CUDA implementation registers), with storage when non-empty.
absl::Status CheckFloatCpu(const TensorView& t, absl::string_view what);

// `t` has the dtype, device and shape of `like`.
absl::Status CheckSameLayout(const TensorView& t, absl::string_view what, const TensorView& like);

}  // namespace recfleet::kernels

#endif  // RECFLEET_KERNELS_OPS_CHECK_H_
