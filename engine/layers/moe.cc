#include "engine/layers/moe.h"

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {

MixtureOfExperts::Expert::Expert(const LayerContext& ctx, const std::string& name, int64_t in,
                                 int64_t hidden, int64_t out)
    : l1(ctx, name + ".l1", in, hidden, true), l2(ctx, name + ".l2", hidden, out, true) {}

MixtureOfExperts::MixtureOfExperts(const LayerContext& ctx, const std::string& name, int64_t in,
                                   int experts, int64_t hidden, int64_t out,
                                   Activation activation)
    : ctx_(ctx), out_(out), activation_(activation), gate_(ctx, name + ".gate", in, experts, true) {
  for (int e = 0; e < experts; ++e) {
    experts_.push_back(
        std::make_unique<Expert>(ctx, absl::StrCat(name, ".expert", e), in, hidden, out));
  }
}

bool MixtureOfExperts::Bf16Hidden(const TensorView& x) const {
  if (x.device != Device::kCuda || ctx_.dtype != DType::kFloat32) return false;
  for (const auto& ex : experts_) {
    if (!ex->l1.TakesBf16Activations(x) || !ex->l2.TakesBf16Activations(x)) return false;
  }
  return !experts_.empty();
}

absl::Status MixtureOfExperts::Forward(const TensorView& x, Tensor* y) {
  routed_by_ = router_;
  if (router_ != nullptr) return ForwardRouted(x, y);
  const int64_t batch = x.dim(0);
  RECFLEET_RETURN_IF_ERROR(gate_.Forward(x, &gate_logits_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_logits_.shape(), &gate_prob_));
  RECFLEET_RETURN_IF_ERROR(ops::SoftmaxRows(gate_logits_.view(), gate_prob_.view()));
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, {batch, out_}, y));
  // The experts' GEMMs round their operands to bf16 (or quantize them to
  // FP8) anyway: round x once for all of them
  // (each would copy it), and keep each hidden layer in bf16 (the GEMM
  // writes h1 rounded, the activation runs on it, and the second GEMM reads
  // a1 as it is) instead of fp32 copies rounded later.
  const bool bf16_hidden = Bf16Hidden(x);
  TensorView expert_in = x;
  x_bf16_ = Tensor();
  if (bf16_hidden && x.dtype != DType::kBFloat16) {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, x.shape, &x_bf16_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(x, x_bf16_.view()));
    expert_in = x_bf16_.view();
  }
  const DType hidden = bf16_hidden ? DType::kBFloat16 : ctx_.dtype;
  for (size_t e = 0; e < experts_.size(); ++e) {
    Expert& ex = *experts_[e];
    RECFLEET_RETURN_IF_ERROR(ex.l1.Forward(expert_in, &ex.h1, hidden));
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, hidden, ex.h1.shape(), &ex.a1));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h1.view(), ex.a1.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Forward(ex.a1.view(), &ex.h2));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.h2.shape(), &ex.a2));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h2.view(), ex.a2.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ops::AddGated(gate_prob_.view(), e, ex.a2.view(), y->view()));
  }
  return absl::OkStatus();
}

absl::Status MixtureOfExperts::Backward(const TensorView& dy, const TensorView& dx,
                                        bool accumulate) {
  if (routed_by_ != nullptr) return BackwardRouted(dy, dx, accumulate);
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, gate_prob_.shape(), &d_gate_));
  for (size_t e = 0; e < experts_.size(); ++e) {
    Expert& ex = *experts_[e];
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.a2.shape(), &d_out_));
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, ex.a1.dtype(), ex.a1.shape(), &d_hidden_));
    RECFLEET_RETURN_IF_ERROR(ops::AddGatedBackward(gate_prob_.view(), e, ex.a2.view(), dy,
                                                   d_out_.view(), d_gate_.view()));
    RECFLEET_RETURN_IF_ERROR(
        ActivationBackward(activation_, ex.h2.view(), d_out_.view(), d_out_.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Backward(d_out_.view(), d_hidden_.view(), false));
    RECFLEET_RETURN_IF_ERROR(
        ActivationBackward(activation_, ex.h1.view(), d_hidden_.view(), d_hidden_.view(), ComputeStream()));
    // Without `accumulate` the first expert overwrites dx (a GEMM with
    // beta = 0) instead of adding to a zeroed dx: one memset less.
    RECFLEET_RETURN_IF_ERROR(ex.l1.Backward(d_hidden_.view(), dx, accumulate || e > 0));
  }
  x_bf16_ = Tensor();  // The experts' weight gradients (stream-ordered) were its last readers.
  if (experts_.empty() && !accumulate) RECFLEET_RETURN_IF_ERROR(ops::Zero(dx));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_prob_.shape(), &d_gate_logits_));
  RECFLEET_RETURN_IF_ERROR(
      ops::SoftmaxRowsBackward(gate_prob_.view(), d_gate_.view(), d_gate_logits_.view()));
  return gate_.Backward(d_gate_logits_.view(), dx, true);
}

absl::Status MixtureOfExperts::ForwardRouted(const TensorView& x, Tensor* y) {
  const int64_t batch = x.dim(0), in = x.dim(1);
  const int64_t num_experts = static_cast<int64_t>(experts_.size());
  const std::vector<int>& local = router_->local_experts();
  const int64_t num_local = static_cast<int64_t>(local.size());
  RECFLEET_RETURN_IF_ERROR(gate_.Forward(x, &gate_logits_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_logits_.shape(), &gate_prob_));
  RECFLEET_RETURN_IF_ERROR(ops::SoftmaxRows(gate_logits_.view(), gate_prob_.view()));
  absl::StatusOr<int64_t> n = router_->Route(batch);
  if (!n.ok()) return n.status();
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {*n, in}, &routed_));
  RECFLEET_RETURN_IF_ERROR(router_->DispatchTokens(x, routed_.view()));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {num_local * *n, out_}, &local_out_));
  for (int64_t i = 0; i < num_local; ++i) {
    Expert& ex = *experts_[local[i]];
    RECFLEET_RETURN_IF_ERROR(ex.l1.Forward(routed_.view(), &ex.h1));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.h1.shape(), &ex.a1));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h1.view(), ex.a1.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Forward(ex.a1.view(), &ex.h2));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.h2.shape(), &ex.a2));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h2.view(), ex.a2.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ops::Copy(ex.a2.view(), RowSlice(local_out_.view(), i * *n, (i + 1) * *n)));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {num_experts * batch, out_}, &outputs_));
  RECFLEET_RETURN_IF_ERROR(router_->ReturnOutputs(local_out_.view(), outputs_.view()));
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, {batch, out_}, y));
  for (int64_t e = 0; e < num_experts; ++e) {
    RECFLEET_RETURN_IF_ERROR(
        ops::AddGated(gate_prob_.view(), e, RowSlice(outputs_.view(), e * batch, (e + 1) * batch), y->view()));
  }
  return absl::OkStatus();
}

absl::Status MixtureOfExperts::BackwardRouted(const TensorView& dy, const TensorView& dx, bool accumulate) {
  ExpertRouter* router = routed_by_;
  const int64_t batch = dy.dim(0), in = dx.dim(1), n = routed_.dim(0);
  const int64_t num_experts = static_cast<int64_t>(experts_.size());
  const std::vector<int>& local = router->local_experts();
  const int64_t num_local = static_cast<int64_t>(local.size());
  // Every expert's output gradient for this rank's tokens, to its owner.
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, gate_prob_.shape(), &d_gate_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {num_experts * batch, out_}, &d_outputs_));
  for (int64_t e = 0; e < num_experts; ++e) {
    RECFLEET_RETURN_IF_ERROR(ops::AddGatedBackward(gate_prob_.view(), e,
                                                   RowSlice(outputs_.view(), e * batch, (e + 1) * batch), dy,
                                                   RowSlice(d_outputs_.view(), e * batch, (e + 1) * batch),
                                                   d_gate_.view()));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {num_local * n, out_}, &d_local_out_));
  RECFLEET_RETURN_IF_ERROR(router->DispatchGradients(d_outputs_.view(), d_local_out_.view()));
  // The local experts' backward over every routed token.
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, {n, in}, &d_routed_));
  for (int64_t i = 0; i < num_local; ++i) {
    Expert& ex = *experts_[local[i]];
    const TensorView d_out = RowSlice(d_local_out_.view(), i * n, (i + 1) * n);
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.a1.shape(), &d_hidden_));
    RECFLEET_RETURN_IF_ERROR(ActivationBackward(activation_, ex.h2.view(), d_out, d_out, ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Backward(d_out, d_hidden_.view(), false));
    RECFLEET_RETURN_IF_ERROR(ActivationBackward(activation_, ex.h1.view(), d_hidden_.view(), d_hidden_.view(), ComputeStream()));
    RECFLEET_RETURN_IF_ERROR(ex.l1.Backward(d_hidden_.view(), d_routed_.view(), true));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {batch, in}, &d_x_));
  RECFLEET_RETURN_IF_ERROR(router->ReturnTokenGradients(d_routed_.view(), d_x_.view()));
  if (accumulate) {
    RECFLEET_RETURN_IF_ERROR(ops::AddScaled(d_x_.view(), 1.0, dx));
  } else {
    RECFLEET_RETURN_IF_ERROR(ops::Copy(d_x_.view(), dx));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_prob_.shape(), &d_gate_logits_));
  RECFLEET_RETURN_IF_ERROR(ops::SoftmaxRowsBackward(gate_prob_.view(), d_gate_.view(), d_gate_logits_.view()));
  return gate_.Backward(d_gate_logits_.view(), dx, true);
}

}  // namespace recfleet::engine::layers
