#include "engine/layers/linear.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "kernels/gemm/linear.h"
#include "kernels/norm/norm.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {
namespace {

bool HasFp8(const LinearRecipe& r) {
  return r.forward == GemmPrecision::kFp8Block || r.dgrad == GemmPrecision::kFp8Block ||
         r.wgrad == GemmPrecision::kFp8Block;
}

// FNV-1a of a layer's name: the same in every process (absl::Hash is seeded
// per process), so a run's wgrad seeds can be replayed.
uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The wgrad seed of a layer's `forward`-th Forward: a splitmix64 finalizer,
// so that consecutive seeds share no structure (the Hadamard signs draw
// from seed + index * golden ratio, which a seed that only counted up would
// shift by one column per step).
uint64_t WgradSeed(uint64_t name_hash, uint64_t forward) {
  uint64_t z = name_hash ^ (forward * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Linear::Linear(const LayerContext& ctx, const std::string& name, int64_t in, int64_t out,
               bool bias)
    : ctx_(ctx),
      recipe_(ctx.linear_recipe_of ? ctx.linear_recipe_of(name) : ctx.recipe),
      name_hash_(NameHash(name)),
      in_(in),
      out_(out),
      has_bias_(bias) {
  ctx.parameters->Register(&w_, name + ".w", {out, in},
                           ParameterInit{1.0 / std::sqrt(static_cast<double>(in)), 0.0});
  if (bias) ctx.parameters->Register(&b_, name + ".b", {out}, ParameterInit{});
  // Backward writes the whole weight gradient once a step.
  ctx.parameters->OverwriteGradientFirst(&w_);
  // The FP8 GEMMs need K and N divisible by 16 (a head's 1-wide logit is
  // not): such a layer keeps the model's recipe.
  if (HasFp8(recipe_) && !Fp8GemmTakesWeight(out, in)) recipe_ = ctx.recipe;
  if (HasFp8(recipe_) && ctx.allocator->device() == Device::kCuda) {
    fp8_ = std::make_unique<LinearContext>();
    w_.use_fp8_form = [this](const TensorView& codes, const TensorView& tile_scales) {
      return UseGivenFp8Weight(codes, tile_scales);
    };
  }
  // The shared bf16 path rounds W once per forward: the registry does it for
  // every such layer in one launch instead.
  if (ctx.allocator->device() == Device::kCuda && LayerContext::AllBf16(recipe_)) {
    ctx.parameters->AddBf16Copy(&w_);
  }
}

const LinearRecipe& Linear::RecipeFor(int64_t rows) const {
  return HasFp8(recipe_) && rows % 16 != 0 ? ctx_.recipe : recipe_;
}

LinearContext* Linear::Fp8ContextFor(int64_t rows) const {
  return HasFp8(RecipeFor(rows)) ? fp8_.get() : nullptr;
}

absl::Status Linear::Forward(const TensorView& x, Tensor* y) { return Forward(x, y, ctx_.dtype); }

absl::Status Linear::Forward(const TensorView& x, Tensor* y, DType y_dtype) {
  const ScopedPhase phase(ctx_.phases, Phase::kGemm);
  const int64_t rows = x.dim(0);
  x_ = x;
  if (recipe_.wgrad_hadamard || recipe_.wgrad_stochastic) {
    recipe_.seed = WgradSeed(name_hash_, forwards_++);
  }
  forward_shared_ = SharesBf16Operands(x);
  x_bf16_ = Tensor();
  if ((x.dtype != ctx_.dtype || y_dtype != ctx_.dtype) &&
      !(TakesBf16Activations(x) && (y_dtype == ctx_.dtype || y_dtype == DType::kBFloat16))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Linear: a ", DTypeName(x.dtype), " input or ", DTypeName(y_dtype),
        " output needs CUDA and GEMMs that round it: an all-bf16 recipe, or FP8 with the rest bf16"));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, y_dtype, {rows, out_}, y));
  // The kernels reject empty matrices, and there is nothing to compute.
  if (rows == 0) return absl::OkStatus();
  if (ctx_.flops != nullptr) ctx_.flops->linear += 2.0 * rows * in_ * out_;
  const TensorView bias = has_bias_ ? b_.value.view() : TensorView();
  if (!forward_shared_) {
    // The weight may have changed since the last step: quantize it anew
    // (unless its writer gave its FP8 form).
    if (fp8_ != nullptr && !fp8_weight_given_) fp8_->InvalidateWeight();
    return LinearForward(Reshaped(x, {rows, in_}), w_.value.view(), bias, y->view(),
                         RecipeFor(rows), ComputeStream(), Fp8ContextFor(rows));
  }
  TensorView x_op = Reshaped(x, {rows, in_});
  if (x.dtype != DType::kBFloat16) {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, {rows, in_}, &x_bf16_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(x_op, x_bf16_.view()));
    x_op = x_bf16_.view();
  }
  if (!w_.bf16.empty() && ctx_.parameters->bf16_copies_current()) {
    w_bf16_ = Tensor();
    w_shared_ = w_.bf16.view();
  } else {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, {out_, in_}, &w_bf16_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(w_.value.view(), w_bf16_.view()));
    w_shared_ = w_bf16_.view();
  }
  return LinearForward(x_op, w_shared_, bias, y->view(), RecipeFor(rows), ComputeStream());
}

absl::Status Linear::UseGivenFp8Weight(const TensorView& codes, const TensorView& tile_scales) {
  if (fp8_ == nullptr) {
    return absl::FailedPreconditionError("Linear: no FP8 GEMM of this layer reads its weight");
  }
  RECFLEET_RETURN_IF_ERROR(fp8_->SetWeight(w_.value.view(), codes, tile_scales, ComputeStream()));
  fp8_weight_given_ = true;
  return absl::OkStatus();
}

bool Linear::SharesBf16Operands(const TensorView& x) const {
  return x.device == Device::kCuda &&
         (x.dtype == DType::kFloat32 || x.dtype == DType::kBFloat16) &&
         LayerContext::AllBf16(RecipeFor(x.dim(0)));
}

bool Linear::TakesBf16Activations(const TensorView& x) const {
  if (SharesBf16Operands(x)) return true;
  const LinearRecipe& r = RecipeFor(x.dim(0));
  // Every GEMM rounds its activations to bf16 or quantizes them to FP8.
  const auto coarse = [](GemmPrecision p) {
    return p == GemmPrecision::kFp8Block || p == GemmPrecision::kBf16;
  };
  return x.device == Device::kCuda && ctx_.dtype == DType::kFloat32 &&
         (x.dtype == DType::kFloat32 || x.dtype == DType::kBFloat16) && fp8_ != nullptr &&
         coarse(r.forward) && coarse(r.dgrad) && coarse(r.wgrad);
}

absl::Status Linear::Backward(const TensorView& dy, const TensorView& dx, bool accumulate) {
  const ScopedPhase phase(ctx_.phases, Phase::kGemm);
  const int64_t rows = x_.dim(0);
  if (rows == 0) return absl::OkStatus();
  const TensorView dy2 = Reshaped(dy, {rows, out_});
  TensorView x_op = x_bf16_.empty() ? Reshaped(x_, {rows, in_}) : x_bf16_.view();
  TensorView dy_op = dy2, w_op = w_.value.view();
  const bool shared = forward_shared_ && SharesBf16Operands(dy2);
  if (shared) {
    if (dy2.dtype != DType::kBFloat16) {
      RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, {rows, out_}, &dy_bf16_));
      RECFLEET_RETURN_IF_ERROR(ops::Convert(dy2, dy_bf16_.view()));
      dy_op = dy_bf16_.view();
    }
    w_op = w_shared_;
    if (has_bias_) {
      RECFLEET_RETURN_IF_ERROR(
          LinearBackwardBias(dy2, b_.grad.view(), /*accumulate=*/true, ComputeStream()));
    }
  }
  // dgrad before wgrad: with an FP8 weight gradient, the FP8 context keeps
  // dy^T from the dgrad for the wgrad that follows; in the other order that
  // copy would outlive the step and match the next step's dy (the pool
  // hands out the same address) in place of its new values.
  absl::Status status;
  if (dx.data != nullptr) {
    // A fan-in (`accumulate`) is summed in the GEMM's epilogue.
    const TensorView dx2 = Reshaped(dx, {rows, in_});
    status = accumulate ? LinearBackwardInputAccumulate(dy_op, w_op, dx2, RecipeFor(rows),
                                                        ComputeStream(), Fp8ContextFor(rows))
                        : LinearBackwardInput(dy_op, w_op, dx2, RecipeFor(rows), ComputeStream(),
                                              Fp8ContextFor(rows));
  }
  if (status.ok()) {
    // A pending gradient (ParameterRegistry::OverwriteGradientFirst) is
    // overwritten: the GEMM neither reads it nor needs it zeroed. The bias
    // gradient computed beside it was zeroed, so overwriting it adds to 0.
    const bool overwrite = w_.grad_pending;
    w_.grad_pending = false;
    status = LinearBackwardWeight(
        dy_op, x_op, w_.grad.view(), has_bias_ && !shared ? b_.grad.view() : TensorView(),
        /*accumulate=*/!overwrite, RecipeFor(rows), ComputeStream(), Fp8ContextFor(rows));
  }
  // The copies are step-sized: give them back to the pool (stream-ordered,
  // so the GEMMs above still read them) for the layers whose backward comes
  // next.
  x_bf16_ = Tensor();
  dy_bf16_ = Tensor();
  return status;
}

RmsNorm::RmsNorm(const LayerContext& ctx, const std::string& name, int64_t dim)
    : ctx_(ctx), dim_(dim) {
  ctx.parameters->Register(&gamma_, name, {dim}, ParameterInit{0.0, 1.0});
}

absl::Status RmsNorm::Forward(const TensorView& x, Tensor* y) { return Forward(x, y, ctx_.dtype); }

absl::Status RmsNorm::Forward(const TensorView& x, Tensor* y, DType y_dtype) {
  const int64_t rows = x.dim(0);
  x_ = x;
  if ((x.dtype != ctx_.dtype || y_dtype != ctx_.dtype) &&
      (x.device != Device::kCuda || ctx_.dtype != DType::kFloat32 ||
       (x.dtype != DType::kBFloat16 && x.dtype != DType::kFloat32) ||
       (y_dtype != DType::kBFloat16 && y_dtype != DType::kFloat32))) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNorm: a ", DTypeName(x.dtype), " input or ",
                                                   DTypeName(y_dtype),
                                                   " output needs CUDA and an fp32 model"));
  }
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, y_dtype, {rows, dim_}, y));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows}, &rstd_));
  if (rows == 0) return absl::OkStatus();
  return RmsNormForward(Reshaped(x, {rows, dim_}), gamma_.value.view(), kEpsilon, y->view(),
                        rstd_.view());
}

absl::Status RmsNorm::Backward(const TensorView& dy, const TensorView& dx) {
  const int64_t rows = x_.dim(0);
  if (rows == 0) return absl::OkStatus();
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {dim_}, &dgamma_));
  RECFLEET_RETURN_IF_ERROR(RmsNormBackward(Reshaped(dy, {rows, dim_}), Reshaped(x_, {rows, dim_}),
                                           gamma_.value.view(), rstd_.view(),
                                           Reshaped(dx, {rows, dim_}), dgamma_.view()));
  return ops::Add(gamma_.grad.view(), dgamma_.view(), gamma_.grad.view());
}

}  // namespace recfleet::engine::layers
