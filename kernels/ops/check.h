#ifndef RECFLEET_KERNELS_OPS_CHECK_H_
#define RECFLEET_KERNELS_OPS_CHECK_H_

// Validation shared by the launchers of kernels/ops (internal), on top of
// kernels/base/checks.h.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/base/checks.h"
#include "kernels/tensor.h"

namespace recfleet {

// `t` is fp32 or fp64 on the CPU: the only implementation these ops have
// until the CUDA one lands; anything else is InvalidArgument naming `what`.
absl::Status CheckFloatCpu(const TensorView& t, absl::string_view what);

// fp32 or fp64 on the CPU, fp32 (or bf16 where `bf16_on_cuda`) on CUDA.
absl::Status CheckFloat(const TensorView& t, absl::string_view what, bool bf16_on_cuda = false);

// `t` is non-null (when non-empty) and has the dtype, device and shape of
// `like`.
absl::Status CheckSameLayout(const TensorView& t, absl::string_view what, const TensorView& like);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_CHECK_H_
