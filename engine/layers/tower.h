#ifndef RECFLEET_ENGINE_LAYERS_TOWER_H_
#define RECFLEET_ENGINE_LAYERS_TOWER_H_

// A prediction head (DESIGN section 2: CTR and CVR towers) and its loss.
// Tower: logits [B] = l2(act(l1(x))), x [B, in]; registers `name`.l1
// [hidden, in] and `name`.l2 [1, hidden]. BinaryCrossEntropy: the mean BCE
// of logits against 0/1 labels. Conventions of engine/layers/layer.h.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/tensor.h"
#include "kernels/ops/activation.h"

namespace recfleet::engine::layers {

class Tower {
 public:
  Tower(const LayerContext& ctx, const std::string& name, int64_t in, int64_t hidden,
        Activation activation);

  // logits [B, 1].
  absl::Status Forward(const TensorView& x, Tensor* logits);
  // dlogits [B] (or [B, 1]); dx [B, in] is overwritten or, with
  // `accumulate`, added to.
  absl::Status Backward(const TensorView& dlogits, const TensorView& dx, bool accumulate);

 private:
  LayerContext ctx_;
  Activation activation_;
  Linear l1_, l2_;
  Tensor hidden_, activated_, d_hidden_;
};

class BinaryCrossEntropy {
 public:
  explicit BinaryCrossEntropy(const LayerContext& ctx) : ctx_(ctx) {}

  // The mean over the batch of BCE(sigmoid(logits), labels); logits [B]
  // (or [B, 1]), labels.size() == B. With dlogits (allocated [B] here), also
  // the gradient of that mean w.r.t. the logits.
  absl::StatusOr<double> Forward(const TensorView& logits, absl::Span<const float> labels,
                                 Tensor* dlogits);
  // Forward in two halves, so that a device model reads the loss back only
  // after the rest of its step is enqueued: Enqueue takes labels already on
  // the model's device (fp32 [B] on CUDA, the model's dtype on the CPU) and
  // computes the per-sample losses (and dlogits); ReadLoss returns their
  // mean (synchronizing with the device).
  absl::Status Enqueue(const TensorView& logits, const TensorView& labels, Tensor* dlogits);
  absl::StatusOr<double> ReadLoss() const;
  // The per-sample losses of the last Enqueue, [B] (valid until the next).
  const TensorView& losses() const { return loss_.view(); }

 private:
  LayerContext ctx_;
  Tensor labels_, loss_, weights_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_TOWER_H_
