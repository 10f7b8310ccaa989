#ifndef RECFLEET_ENGINE_LAYERS_MOE_H_
#define RECFLEET_ENGINE_LAYERS_MOE_H_

// A softmax-gated mixture of expert MLPs (DESIGN section 2): for x [B, in],
//   p = softmax(gate(x)) [B, E],  expert_e(x) = act(l2(act(l1(x)))),
//   y = sum_e p[:, e] * expert_e(x)   [B, out].
// Every expert sees every sample (dense gating). Registers `name`.gate, then
// `name`.expert<e>.l1 / .l2. Conventions of engine/layers/layer.h.
//
// Expert parallelism (DESIGN section 3): with an ExpertRouter set, this
// rank computes only its own experts, on the tokens of every rank of its
// expert-parallel group, and the router moves rows between the ranks; the
// gate and the mixing stay local. The other experts' parameters get no
// gradient here (their owners compute it).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/tensor.h"
#include "kernels/ops/activation.h"

namespace recfleet::engine::layers {

// Moves the rows of one MoE layer between the ranks of an expert-parallel
// group (worker/dist/expert_parallel.h: all-to-alls). Blocks are
// expert-major: rows [i * n, (i + 1) * n) belong to the i-th expert of the
// block. Every rank of the group calls the methods in the same order (the
// order of one Forward and one Backward), each with its own batch size.
class ExpertRouter {
 public:
  virtual ~ExpertRouter() = default;
  // The experts this rank computes, ascending (possibly none).
  virtual const std::vector<int>& local_experts() const = 0;
  // Exchanges batch sizes: this rank has `batch` tokens; returns n, the
  // tokens routed to this rank's experts (every token of every rank of the
  // group when it computes any expert, since every expert sees every token).
  virtual absl::StatusOr<int64_t> Route(int64_t batch) = 0;
  // x [batch, in] -> routed [n, in]: the tokens of every rank, in rank order.
  virtual absl::Status DispatchTokens(const TensorView& x, const TensorView& routed) = 0;
  // local_out [local experts * n, out] -> outputs [experts * batch, out]:
  // every expert's outputs for this rank's tokens.
  virtual absl::Status ReturnOutputs(const TensorView& local_out, const TensorView& outputs) = 0;
  // The backward of ReturnOutputs: d_outputs [experts * batch, out] ->
  // d_local_out [local experts * n, out].
  virtual absl::Status DispatchGradients(const TensorView& d_outputs, const TensorView& d_local_out) = 0;
  // The backward of DispatchTokens: d_routed [n, in] (summed over this
  // rank's experts) -> dx [batch, in], summed over the ranks.
  virtual absl::Status ReturnTokenGradients(const TensorView& d_routed, const TensorView& dx) = 0;
};

class MixtureOfExperts {
 public:
  MixtureOfExperts(const LayerContext& ctx, const std::string& name, int64_t in, int experts,
                   int64_t hidden, int64_t out, Activation activation);
  MixtureOfExperts(const MixtureOfExperts&) = delete;
  MixtureOfExperts& operator=(const MixtureOfExperts&) = delete;

  absl::Status Forward(const TensorView& x, Tensor* y);
  // dx [B, in] is overwritten or, with `accumulate`, added to.
  absl::Status Backward(const TensorView& dy, const TensorView& dx, bool accumulate);

  // Not owned; null (the default): every expert computed here. Set between
  // steps only (a Backward follows the Forward that used the same router).
  void SetRouter(ExpertRouter* router) { router_ = router; }
  int num_experts() const { return static_cast<int>(experts_.size()); }

 private:
  absl::Status ForwardRouted(const TensorView& x, Tensor* y);
  absl::Status BackwardRouted(const TensorView& dy, const TensorView& dx, bool accumulate);

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
  // The bf16 path (Bf16Hidden: every expert layer takes bf16 activations,
  // Linear::TakesBf16Activations): x rounded once for every expert's first
  // layer; each expert's hidden layer (h1, a1 and its gradient) in bf16.
  bool Bf16Hidden(const TensorView& x) const;
  Tensor x_bf16_;
  Tensor gate_logits_, gate_prob_;
  Tensor d_out_, d_hidden_, d_gate_, d_gate_logits_;
  // Expert parallelism: the router of the last Forward, the routed tokens,
  // the local experts' outputs, every expert's outputs for this rank's
  // tokens, and their gradients.
  ExpertRouter* router_ = nullptr;
  ExpertRouter* routed_by_ = nullptr;
  Tensor routed_, local_out_, outputs_, d_outputs_, d_local_out_, d_routed_, d_x_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_MOE_H_
