#ifndef RECFLEET_KERNELS_OPS_BCE_H_
#define RECFLEET_KERNELS_OPS_BCE_H_

// Binary cross-entropy on logits, the loss of the CTR and CVR heads,
// computed in the numerically stable form
//   loss = max(z, 0) - z * y + log(1 + exp(-|z|))
// so large |z| neither overflows nor loses the small term.
// CPU reference in fp32 or fp64; the CUDA implementation takes the same calls.

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet {

// loss[i] = BCE(sigmoid(logits[i]), labels[i]). logits, labels and loss are
// rank-1 [N] of the same dtype and device; labels lie in [0, 1].
absl::Status BceWithLogitsForward(const TensorView& logits, const TensorView& labels,
                                  const TensorView& loss, void* stream = nullptr);

// dlogits[i] = dloss[i] * (sigmoid(logits[i]) - labels[i]). All [N], same
// dtype; dlogits may alias dloss.
absl::Status BceWithLogitsBackward(const TensorView& logits, const TensorView& labels,
                                   const TensorView& dloss, const TensorView& dlogits, void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_BCE_H_
