#ifndef RECFLEET_KERNELS_OPS_ACTIVATION_H_
#define RECFLEET_KERNELS_OPS_ACTIVATION_H_

// Elementwise activations, forward and backward, on dense tensors of any
// shape. CPU reference in fp32 or fp64 (fp64 is for gradient checks);
// the CUDA implementation takes the same calls.
//
// GELU is exact, x * Phi(x) (Phi the standard normal CDF), as in the
// attention kernels' GDPA activation; SiLU is x * sigmoid(x).

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace recfleet {

enum class Activation { kRelu, kGelu, kSilu };

// "relu", "gelu", "silu".
absl::string_view ActivationName(Activation act);
// Parses the names above; InvalidArgument names the accepted values.
absl::StatusOr<Activation> ParseActivation(absl::string_view name);

// y = act(x). x and y have the same shape, dtype and device; y may alias x.
absl::Status ActivationForward(Activation act, const TensorView& x, const TensorView& y,
                         void* stream = nullptr);

// dx = dy * act'(x), where x is the forward input. All four tensors have
// the same shape, dtype and device; dx may alias dy.
absl::Status ActivationBackward(Activation act, const TensorView& x, const TensorView& dy,
                                const TensorView& dx, void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_ACTIVATION_H_
