#ifndef RECFLEET_ENGINE_LAYERS_MOE_H_
#define RECFLEET_ENGINE_LAYERS_MOE_H_

// A softmax-gated mixture of expert MLPs (DESIGN section 2): for x [B, in],
//   p = softmax(gate(x)) [B, E],  expert_e(x) = act(l2(act(l1(x)))),
//   y = sum_e p[:, e] * expert_e(x)   [B, out].
// Every expert sees every sample (dense gating). Registers `name`.gate, then
// `name`.expert<e>.l1 / .l2. Conventions of engine/layers/layer.h.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/tensor.h"
#include "kernels/ops/activation.h"

namespace recfleet::engine::layers {

class MixtureOfExperts {
 public:
  MixtureOfExperts(const LayerContext& ctx, const std::string& name, int64_t in, int experts,
                   int64_t hidden, int64_t out, Activation activation);
  MixtureOfExperts(const MixtureOfExperts&) = delete;
  MixtureOfExperts& operator=(const MixtureOfExperts&) = delete;

  absl::Status Forward(const TensorView& x, Tensor* y);
  // dx [B, in] is overwritten or, with `accumulate`, added to.
  absl::Status Backward(const TensorView& dy, const TensorView& dx, bool accumulate);

 private:
  struct Expert {
    Expert(const LayerContext& ctx, const std::string& name, int64_t in, int64_t hidden,
           int64_t out);
    Linear l1, l2;
    Tensor h1, a1, h2, a2;  // Pre- and post-activation outputs of the last forward.
  };

  LayerContext ctx_;
  int64_t out_;
  Activation activation_;
  Linear gate_;
  std::vector<std::unique_ptr<Expert>> experts_;
  Tensor gate_logits_, gate_prob_;
  Tensor d_out_, d_hidden_, d_gate_, d_gate_logits_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_MOE_H_
