#ifndef RECFLEET_KERNELS_OPS_ADAM_INTERNAL_H_
#define RECFLEET_KERNELS_OPS_ADAM_INTERNAL_H_

// What AdamStep (adam.cc) and MultiTensorAdam (multi_tensor.cc) share:
// the validation of a step and the fp32 scalars the CUDA kernels take.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {

// InvalidArgument for step < 1 or lr/betas/eps/weight decay out of range.
absl::Status CheckAdamConfig(const AdamConfig& config, int64_t step);
// InvalidArgument unless config.grad_scale is empty or one element of
// param's dtype and device.
absl::Status CheckGradScale(const AdamConfig& config, const TensorView& param);
// The bias-corrected scalars of `step`, computed in double as the CPU
// reference does and rounded to fp32 once.
ops_cuda::AdamScalars CudaAdamScalars(const AdamConfig& config, int64_t step);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_ADAM_INTERNAL_H_
