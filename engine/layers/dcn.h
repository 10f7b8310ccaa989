#ifndef RECFLEET_ENGINE_LAYERS_DCN_H_
#define RECFLEET_ENGINE_LAYERS_DCN_H_

// DCN-style cross layers (DESIGN section 2, dense interaction) on the
// concatenated per-sample tokens x0 [B, width]:
//   x_{c+1} = x0 * (W_c x_c + b_c) + x_c,   c = 0 .. layers - 1,
// output x_layers (a copy of x0 with zero layers). Registers `name`<c>.w/.b.
// Conventions of engine/layers/layer.h.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/tensor.h"

namespace recfleet::engine::layers {

class Dcn {
 public:
  Dcn(const LayerContext& ctx, const std::string& name, int layers, int64_t width);
  Dcn(const Dcn&) = delete;
  Dcn& operator=(const Dcn&) = delete;

  absl::Status Forward(const TensorView& x0, Tensor* y);
  // dx0 [B, width] is overwritten (x0 reaches the output through every
  // product and through the residual chain).
  absl::Status Backward(const TensorView& dy, const TensorView& dx0);

 private:
  LayerContext ctx_;
  int64_t width_;
  std::vector<std::unique_ptr<Linear>> cross_;
  TensorView x0_;
  std::vector<Tensor> x_;  // x_[c] = x_{c+1} for c < layers - 1 (the last one is y).
  std::vector<Tensor> u_;  // u_[c] = W_c x_c + b_c.
  Tensor dx_, du_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_DCN_H_
