#ifndef RECFLEET_KERNELS_NORM_NORM_INTERNAL_H_
#define RECFLEET_KERNELS_NORM_NORM_INTERNAL_H_

// Device implementations behind norm.h; arguments are validated by the
// dispatcher. One entry point per direction serves both norms: LayerNorm
// passes `mean` (and `beta`/`dbeta`), RMSNorm passes empty views there.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet::norm_internal {

struct NormArgs {
  int64_t rows = 0, dim = 0;
  bool layer_norm = false;  // subtract the mean and add beta
};

// y_scales is set (data != nullptr) exactly when y is FP8.
absl::Status ForwardCpu(const NormArgs& a, const TensorView& x, const TensorView& gamma,
                        const TensorView& beta, float eps, const TensorView& y,
                        const TensorView& y_scales, const TensorView& mean,
                        const TensorView& rstd);
absl::Status BackwardCpu(const NormArgs& a, const TensorView& dy, const TensorView& x,
                         const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                         const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta);

absl::Status ForwardCuda(const NormArgs& a, const TensorView& x, const TensorView& gamma,
                         const TensorView& beta, float eps, const TensorView& y,
                         const TensorView& y_scales, const TensorView& mean,
                         const TensorView& rstd, void* stream);
absl::Status BackwardCuda(const NormArgs& a, const TensorView& dy, const TensorView& x,
                          const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                          const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta,
                          void* stream);

}  // namespace recfleet::norm_internal

#endif  // RECFLEET_KERNELS_NORM_NORM_INTERNAL_H_
