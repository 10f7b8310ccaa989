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

absl::Status MixtureOfExperts::Forward(const TensorView& x, Tensor* y) {
  const int64_t batch = x.dim(0);
  RECFLEET_RETURN_IF_ERROR(gate_.Forward(x, &gate_logits_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_logits_.shape(), &gate_prob_));
  RECFLEET_RETURN_IF_ERROR(ops::SoftmaxRows(gate_logits_.view(), gate_prob_.view()));
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, {batch, out_}, y));
  for (size_t e = 0; e < experts_.size(); ++e) {
    Expert& ex = *experts_[e];
    RECFLEET_RETURN_IF_ERROR(ex.l1.Forward(x, &ex.h1));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.h1.shape(), &ex.a1));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h1.view(), ex.a1.view()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Forward(ex.a1.view(), &ex.h2));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.h2.shape(), &ex.a2));
    RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, ex.h2.view(), ex.a2.view()));
    RECFLEET_RETURN_IF_ERROR(ops::AddGated(gate_prob_.view(), e, ex.a2.view(), y->view()));
  }
  return absl::OkStatus();
}

absl::Status MixtureOfExperts::Backward(const TensorView& dy, const TensorView& dx,
                                        bool accumulate) {
  if (!accumulate) RECFLEET_RETURN_IF_ERROR(ops::Zero(dx));
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, gate_prob_.shape(), &d_gate_));
  for (size_t e = 0; e < experts_.size(); ++e) {
    Expert& ex = *experts_[e];
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.a2.shape(), &d_out_));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, ex.a1.shape(), &d_hidden_));
    RECFLEET_RETURN_IF_ERROR(ops::AddGatedBackward(gate_prob_.view(), e, ex.a2.view(), dy,
                                                   d_out_.view(), d_gate_.view()));
    RECFLEET_RETURN_IF_ERROR(
        ActivationBackward(activation_, ex.h2.view(), d_out_.view(), d_out_.view()));
    RECFLEET_RETURN_IF_ERROR(ex.l2.Backward(d_out_.view(), d_hidden_.view(), false));
    RECFLEET_RETURN_IF_ERROR(
        ActivationBackward(activation_, ex.h1.view(), d_hidden_.view(), d_hidden_.view()));
    RECFLEET_RETURN_IF_ERROR(ex.l1.Backward(d_hidden_.view(), dx, true));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, gate_prob_.shape(), &d_gate_logits_));
  RECFLEET_RETURN_IF_ERROR(
      ops::SoftmaxRowsBackward(gate_prob_.view(), d_gate_.view(), d_gate_logits_.view()));
  return gate_.Backward(d_gate_logits_.view(), dx, true);
}

}  // namespace recfleet::engine::layers
