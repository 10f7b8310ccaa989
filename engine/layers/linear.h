#ifndef RECFLEET_ENGINE_LAYERS_LINEAR_H_
#define RECFLEET_ENGINE_LAYERS_LINEAR_H_

// The two parameterized building blocks of every bigger layer: a linear
// layer y = x W^T + b and an RMSNorm over the last dimension. Conventions of
// engine/layers/layer.h (forward keeps its input's view; backward adds to
// the parameter gradients). Zero rows (a batch whose histories are all
// empty) are valid and compute nothing.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/layers/layer.h"
#include "engine/layers/parameters.h"
#include "engine/tensor.h"

namespace recfleet::engine::layers {

class Linear {
 public:
  // Registers `name`.w [out, in] (N(0, 1/in)) and, with bias, `name`.b
  // [out] (zeros). Its GEMMs run ctx.linear_recipe_of(name) when set (the
  // job's per-layer recipe), else ctx.recipe; see RecipeFor. A recipe with
  // the wgrad Hadamard transform or stochastic rounding gets a new seed at
  // every Forward, from the name and the count of the layer's forwards (the
  // same in every run); the next Backward's weight gradient uses it for
  // both of its operands.
  Linear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out, bool bias);
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // y [rows, out] = x [rows, in] W^T + b; counts 2 * rows * in * out FLOPs.
  absl::Status Forward(const TensorView& x, Tensor* y);
  // The same with y allocated in `y_dtype`. A bf16 x or y is for the layers
  // whose GEMMs round their activations anyway (TakesBf16Activations):
  // chains of such layers then pass bf16 activations.
  absl::Status Forward(const TensorView& x, Tensor* y, DType y_dtype);
  // Adds dW = dy^T x and db to the gradients. dx [rows, in] (= dy W) is
  // overwritten, or with `accumulate` added to (in the GEMM's epilogue, no
  // scratch); an empty view (data == nullptr) skips it. dy and dx may be
  // bf16 under the same condition as above.
  absl::Status Backward(const TensorView& dy, const TensorView& dx, bool accumulate);

  // Activation checkpointing: Backward reads x, a recomputed or restored
  // copy of the last Forward's input (its shape and dtype), in place of that
  // input, which may then be gone. A bf16 copy the shared path made of an
  // fp32 input (and an FP8 layer's quantized X^T) is kept and still used.
  // A recomputing Forward draws a new wgrad seed (see the constructor); the
  // weight gradient then uses the new one throughout.
  void RebindInput(const TensorView& x) { x_ = x; }

  // CUDA, a layer with an FP8 GEMM: from now on its FP8 GEMMs use `codes`
  // [out, in] (E4M3) and `tile_scales` (128x128 tiles; kernels/gemm/
  // linear.h LinearContext::SetWeight) as W's FP8 form instead of
  // quantizing W at every Forward. For a W written together with its FP8
  // form: FSDP's FP8 all-gather writes W as the codes' dequantized values
  // and hands the codes over with each gather (worker/distributed_model.h),
  // so the GEMMs take the gathered codes as they are. Whoever writes W
  // afterwards gives its codes again (the layer keeps the last ones). The
  // weight's Parameter::use_fp8_form calls this.
  absl::Status UseGivenFp8Weight(const TensorView& codes, const TensorView& tile_scales);

  // CUDA with an all-bf16 recipe: every GEMM of the layer would round its
  // operands to bf16 itself, x and W twice each, dy twice. The layer rounds
  // each once instead: W and an fp32 x in Forward (x's copy kept for the
  // weight gradient, freed by Backward), an fp32 dy in Backward; bf16 ones
  // are used as they are. The bias gradient sums dy as given, so the
  // numerics equal the unshared path's. True: x (of its row count) may be
  // bf16 and Forward may write a bf16 y.
  bool SharesBf16Operands(const TensorView& x) const;

  // True: x (of its row count) may be bf16 and Forward may write a bf16 y.
  // The shared path above, or a CUDA layer of an fp32 model whose GEMMs at
  // that row count are FP8, with the rest bf16: the FP8 GEMMs quantize a
  // bf16 x or dy as they do fp32 ones and write either output, and a bf16
  // weight gradient reads bf16 x and dy as they are (from fp32 ones the FP8
  // quantize passes write the bf16 copies; linear.h LinearContext).
  bool TakesBf16Activations(const TensorView& x) const;

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  Parameter& weight() { return w_; }
  Parameter* bias() { return has_bias_ ? &b_ : nullptr; }

 private:
  bool forward_shared_ = false;  // The last Forward took the shared path.
  // The one place the layer's precision is decided: its own recipe, except
  // that an FP8 layer runs a call of `rows` rows the FP8 GEMMs cannot take
  // (not a multiple of 16, e.g. an eval batch) at ctx.recipe. The FP8
  // context (quantized W and W^T once per Forward, X^T kept for the weight
  // gradient) comes with the FP8 calls; null otherwise.
  const LinearRecipe& RecipeFor(int64_t rows) const;
  LinearContext* Fp8ContextFor(int64_t rows) const;

  LayerContext ctx_;
  LinearRecipe recipe_;  // Its seed: the last Forward's (see the constructor).
  uint64_t name_hash_;
  uint64_t forwards_ = 0;
  std::unique_ptr<LinearContext> fp8_;  // CUDA, when recipe_ has an FP8 GEMM.
  bool fp8_weight_given_ = false;       // UseGivenFp8Weight was called.
  int64_t in_, out_;
  bool has_bias_;
  Parameter w_, b_;
  TensorView x_;
  Tensor x_bf16_, w_bf16_, dy_bf16_;
  // The bf16 W of the last shared Forward: the registry's copy when
  // current, else w_bf16_.
  TensorView w_shared_;
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
  // The same with y allocated in `y_dtype`. On CUDA (fp32 model) x and y
  // may each be fp32 or bf16: the statistics are fp32 either way, and a
  // bf16 y is rounded once, so a bf16 activation stream needs no separate
  // conversion pass.
  absl::Status Forward(const TensorView& x, Tensor* y, DType y_dtype);
  // dx [rows, dim] is overwritten; gamma's gradient accumulates. On CUDA dy
  // and dx may be fp32 or bf16 independently of x.
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
