#ifndef RECFLEET_KERNELS_OPS_ADAM_H_
#define RECFLEET_KERNELS_OPS_ADAM_H_

// One Adam / AdamW step on a dense parameter, its gradient and its two
// moment buffers: the dense optimizer on fp32 master weights. CPU
// reference in fp32 or fp64; the CUDA implementation takes the same calls.
//
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// weight decay: AdamW (decoupled) first scales p by (1 - lr wd); plain Adam
// adds wd p to g instead. With a gradient scale (AdamConfig::grad_scale, the
// factor of global-norm clipping, grad_clip.h) g is first multiplied by it.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet {

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // true: AdamW.
  // Optional: one element of the param's dtype on its device (fp32 on
  // CUDA), read there by the step, so a factor computed on the device
  // (GradClipScale) needs no host round trip. Empty: 1.
  TensorView grad_scale;
};

// Applies step `step` (1-based: the bias corrections use it) in place.
// param, grad, m and v have the same shape, dtype and device; m and v start
// at zero before step 1. InvalidArgument for step < 1 or lr/betas/eps out of
// range (lr >= 0, 0 <= beta < 1, eps > 0).
absl::Status AdamStep(const AdamConfig& config, int64_t step, const TensorView& param,
                      const TensorView& grad, const TensorView& m, const TensorView& v,
                      void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_ADAM_H_
