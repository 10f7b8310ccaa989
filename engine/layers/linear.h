#ifndef RECFLEET_ENGINE_LAYERS_LINEAR_H_
#define RECFLEET_ENGINE_LAYERS_LINEAR_H_

// The two parameterized building blocks of every bigger layer: a linear
// layer y = x W^T + b and an RMSNorm over the last dimension. Conventions of
// engine/layers/layer.h (forward keeps its input's view; backward adds to
// the parameter gradients). Zero rows (a batch whose histories are all
// empty) are valid and compute nothing.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/layers/layer.h"
#include "engine/layers/parameters.h"
#include "engine/tensor.h"

namespace recfleet::engine::layers {

class Linear {
 public:
  // Registers `name`.w [out, in] (N(0, 1/in)) and, with bias, `name`.b
  // [out] (zeros).
  Linear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out, bool bias);
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // y [rows, out] = x [rows, in] W^T + b; counts 2 * rows * in * out FLOPs.
  absl::Status Forward(const TensorView& x, Tensor* y);
  // Adds dW = dy^T x and db to the gradients. dx [rows, in] (= dy W) is
  // overwritten, or with `accumulate` added to; an empty view (data ==
  // nullptr) skips it.
  absl::Status Backward(const TensorView& dy, const TensorView& dx, bool accumulate);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  Parameter& weight() { return w_; }
  Parameter* bias() { return has_bias_ ? &b_ : nullptr; }

 private:
  LayerContext ctx_;
  int64_t in_, out_;
  bool has_bias_;
  Parameter w_, b_;
  TensorView x_;
  Tensor dx_scratch_;
};

class RmsNorm {
 public:
  // Registers `name` [dim] (ones): the gain gamma.
  RmsNorm(const LayerContext& ctx, const std::string& name, int64_t dim);
  RmsNorm(const RmsNorm&) = delete;
  RmsNorm& operator=(const RmsNorm&) = delete;

  static constexpr float kEpsilon = 1e-6f;

  // y = x / sqrt(mean(x^2) + eps) * gamma over rows of x [rows, dim].
  absl::Status Forward(const TensorView& x, Tensor* y);
  // dx [rows, dim] is overwritten; gamma's gradient accumulates.
  absl::Status Backward(const TensorView& dy, const TensorView& dx);

  Parameter& gamma() { return gamma_; }

 private:
  LayerContext ctx_;
  int64_t dim_;
  Parameter gamma_;
  TensorView x_;
  Tensor rstd_, dgamma_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_LINEAR_H_
