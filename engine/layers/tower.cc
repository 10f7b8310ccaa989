#include "engine/layers/tower.h"

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "kernels/ops/bce.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {

Tower::Tower(const LayerContext& ctx, const std::string& name, int64_t in, int64_t hidden,
             Activation activation)
    : ctx_(ctx),
      activation_(activation),
      l1_(ctx, name + ".l1", in, hidden, true),
      l2_(ctx, name + ".l2", hidden, 1, true) {}

absl::Status Tower::Forward(const TensorView& x, Tensor* logits) {
  RECFLEET_RETURN_IF_ERROR(l1_.Forward(x, &hidden_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, hidden_.shape(), &activated_));
  RECFLEET_RETURN_IF_ERROR(ActivationForward(activation_, hidden_.view(), activated_.view(), ComputeStream()));
  return l2_.Forward(activated_.view(), logits);
}

absl::Status Tower::Backward(const TensorView& dlogits, const TensorView& dx, bool accumulate) {
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, hidden_.shape(), &d_hidden_));
  RECFLEET_RETURN_IF_ERROR(l2_.Backward(dlogits, d_hidden_.view(), false));
  RECFLEET_RETURN_IF_ERROR(
      ActivationBackward(activation_, hidden_.view(), d_hidden_.view(), d_hidden_.view(), ComputeStream()));
  return l1_.Backward(d_hidden_.view(), dx, accumulate);
}

absl::StatusOr<double> BinaryCrossEntropy::Forward(const TensorView& logits,
                                                   absl::Span<const float> labels,
                                                   Tensor* dlogits) {
  const int64_t batch = static_cast<int64_t>(labels.size());
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {batch}, &labels_));
  RECFLEET_RETURN_IF_ERROR(ops::CopyFromHost(labels, labels_.view()));
  RECFLEET_RETURN_IF_ERROR(Enqueue(logits, labels_.view(), dlogits));
  return ReadLoss();
}

absl::Status BinaryCrossEntropy::Enqueue(const TensorView& logits, const TensorView& labels,
                                         Tensor* dlogits) {
  const int64_t batch = labels.numel();
  if (logits.numel() != batch) {
    return absl::InvalidArgumentError(absl::StrCat("BinaryCrossEntropy: ", batch,
                                                   " labels for logits ", logits.DebugString()));
  }
  const TensorView z = Reshaped(logits, {batch});
  const TensorView y = Reshaped(labels, {batch});
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {batch}, &loss_));
  RECFLEET_RETURN_IF_ERROR(BceWithLogitsForward(z, y, loss_.view()));
  if (dlogits != nullptr) {
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {batch}, &weights_));
    RECFLEET_RETURN_IF_ERROR(ops::FillMeanWeights(weights_.view()));
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {batch}, dlogits));
    RECFLEET_RETURN_IF_ERROR(BceWithLogitsBackward(z, y, weights_.view(), dlogits->view()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> BinaryCrossEntropy::ReadLoss() const {
  absl::StatusOr<double> total = ops::SumToHost(loss_.view());
  if (!total.ok()) return total.status();
  return *total / static_cast<double>(loss_.numel());
}

}  // namespace recfleet::engine::layers
