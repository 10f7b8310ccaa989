#ifndef RECFLEET_KERNELS_OPS_GRAD_CLIP_H_
#define RECFLEET_KERNELS_OPS_GRAD_CLIP_H_

// Global-norm gradient clipping with the semantics of PyTorch's
// torch.nn.utils.clip_grad_norm_(params, max_norm) (norm_type 2,
// error_if_nonfinite False):
//   total = sqrt(sum of g^2 over every element of every gradient)
//   scale = min(1, max_norm / (total + 1e-6))
//   every gradient is multiplied by scale before the optimizer reads it.
// A non-finite total goes through as PyTorch lets it: a NaN total gives a
// NaN scale (the step then writes NaN parameters: the run's loss shows the
// divergence instead of training on silently); an infinite total gives
// scale 0 (finite gradients become 0, infinite ones NaN).
//
// Three pieces, so a sharded job can all-reduce the sum of squares between
// the first two and nothing waits for the host:
//   MultiTensorAdam::GradSquaredNorm   sum[0] = sum of g^2 (multi_tensor.h)
//   GradClipScale                      scale[0] from sum[0] (below)
//   AdamConfig::grad_scale = scale     the step multiplies g by scale[0]

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet {

// scale[0] = min(1, max_norm / (sqrt(total) + 1e-6)) in fp64 arithmetic,
// NaN when that ratio is NaN, where total is the sum of sum_sq's elements
// (one or more parts of the squared norm: a sharded model's, say), added in
// order in fp64. sum_sq and scale (one element) of one dtype (fp32 or fp64
// on the CPU, fp32 on CUDA) on one device; on CUDA one single-thread launch
// on `stream`. InvalidArgument for another layout or a max_norm that is not
// finite and > 0.
absl::Status GradClipScale(const TensorView& sum_sq, double max_norm, const TensorView& scale,
                           void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_GRAD_CLIP_H_
