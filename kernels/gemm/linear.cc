#include "kernels/gemm/linear.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/gemm/linear_internal.h"

namespace recfleet {
namespace {

using linear_internal::Operand;

absl::Status CheckMatrix(const TensorView& t, absl::string_view what, const TensorView& ref,
                         int64_t rows, int64_t cols) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, ref.device));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(t, what));
  RECFLEET_RETURN_IF_ERROR(CheckRank(t, what, 2));
  RECFLEET_RETURN_IF_ERROR(CheckDim(t, what, 0, rows));
  return CheckDim(t, what, 1, cols);
}

// An optional [n] vector (bias/dbias): absent when data is null.
absl::Status CheckOptionalVector(const TensorView& t, absl::string_view what,
                                 const TensorView& ref, int64_t n) {
  if (t.data == nullptr) return absl::OkStatus();
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, ref.device));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(t, what));
  RECFLEET_RETURN_IF_ERROR(CheckRank(t, what, 1));
  return CheckDim(t, what, 0, n);
}

absl::Status CheckInput(const TensorView& t, absl::string_view what) {
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(t, what));
  if (t.rank() != 2 || t.dim(0) < 1 || t.dim(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-empty matrix, got ", t.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status Gemm(linear_internal::GemmRole role, const Operand& a, const Operand& b,
                  GemmPrecision precision, const TensorView& bias, bool accumulate,
                  const TensorView& c, const LinearRecipe& recipe, void* stream,
                  LinearContext* context) {
  if (c.device == Device::kCpu) {
    return linear_internal::GemmCpu(a, b, precision, bias, accumulate, c);
  }
  return linear_internal::GemmCuda(role, a, b, precision, bias, accumulate, c, recipe, stream,
                                   context);
}

}  // namespace

namespace linear_internal {

Operand WgradOperand(const TensorView& t, bool is_dy, const LinearRecipe& recipe) {
  Operand op{t, true, ScaleBlock::k1x128};
  op.hadamard = recipe.wgrad_hadamard;
  op.hadamard_seed = recipe.seed;
  if (is_dy && recipe.wgrad_stochastic) {
    op.rounding = Rounding::kStochastic;
    op.seed = recipe.seed ^ 0x9E3779B97F4A7C15ull;  // not the Hadamard signs' stream
  }
  return op;
}

}  // namespace linear_internal

absl::string_view GemmPrecisionName(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kNative: return "native";
    case GemmPrecision::kBf16: return "bf16";
    case GemmPrecision::kFp8Block: return "fp8_block";
  }
  return "unknown";
}

absl::Status LinearForward(const TensorView& x, const TensorView& w, const TensorView& bias,
                           const TensorView& y, const LinearRecipe& recipe, void* stream,
                           LinearContext* context) {
  RECFLEET_RETURN_IF_ERROR(CheckInput(x, "x"));
  const int64_t m = x.dim(0), k = x.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckInput(w, "w"));
  const int64_t n = w.dim(0);
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(w, "w", x, n, k));
  RECFLEET_RETURN_IF_ERROR(CheckOptionalVector(bias, "bias", x, n));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(y, "y", x, m, n));
  return Gemm(linear_internal::GemmRole::kForward, {x, false, ScaleBlock::k1x128},
              {w, false, ScaleBlock::k128x128}, recipe.forward, bias, false, y, recipe, stream,
              context);
}

namespace {

absl::Status BackwardInput(const TensorView& dy, const TensorView& w, const TensorView& dx,
                           bool accumulate, const LinearRecipe& recipe, void* stream,
                           LinearContext* context) {
  RECFLEET_RETURN_IF_ERROR(CheckInput(dy, "dy"));
  const int64_t m = dy.dim(0), n = dy.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckInput(w, "w"));
  const int64_t k = w.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(w, "w", dy, n, k));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(dx, "dx", dy, m, k));
  return Gemm(linear_internal::GemmRole::kDgrad, {dy, false, ScaleBlock::k1x128},
              {w, true, ScaleBlock::k128x128}, recipe.dgrad, TensorView(), accumulate, dx, recipe,
              stream, context);
}

}  // namespace

absl::Status LinearBackwardInput(const TensorView& dy, const TensorView& w, const TensorView& dx,
                                 const LinearRecipe& recipe, void* stream,
                                 LinearContext* context) {
  return BackwardInput(dy, w, dx, /*accumulate=*/false, recipe, stream, context);
}

absl::Status LinearBackwardInputAccumulate(const TensorView& dy, const TensorView& w,
                                           const TensorView& dx, const LinearRecipe& recipe,
                                           void* stream, LinearContext* context) {
  return BackwardInput(dy, w, dx, /*accumulate=*/true, recipe, stream, context);
}

absl::Status LinearBackwardWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                                  const TensorView& dbias, bool accumulate,
                                  const LinearRecipe& recipe, void* stream,
                                  LinearContext* context) {
  RECFLEET_RETURN_IF_ERROR(CheckInput(dy, "dy"));
  const int64_t m = dy.dim(0), n = dy.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckInput(x, "x"));
  const int64_t k = x.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(x, "x", dy, m, k));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(dw, "dw", dy, n, k));
  RECFLEET_RETURN_IF_ERROR(CheckOptionalVector(dbias, "dbias", dy, n));
  RECFLEET_RETURN_IF_ERROR(Gemm(linear_internal::GemmRole::kWgrad,
                                linear_internal::WgradOperand(dy, true, recipe),
                                linear_internal::WgradOperand(x, false, recipe), recipe.wgrad,
                                TensorView(), accumulate, dw, recipe, stream, context));
  if (dbias.data == nullptr) return absl::OkStatus();
  return LinearBackwardBias(dy, dbias, accumulate, stream);
}

absl::Status LinearBackwardBias(const TensorView& dy, const TensorView& dbias, bool accumulate,
                                void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckInput(dy, "dy"));
  RECFLEET_RETURN_IF_ERROR(CheckOptionalVector(dbias, "dbias", dy, dy.dim(1)));
  if (dbias.data == nullptr) return absl::OkStatus();
  if (dy.device == Device::kCpu) return linear_internal::BiasGradCpu(dy, accumulate, dbias);
  return linear_internal::BiasGradCuda(dy, accumulate, dbias, stream);
}

}  // namespace recfleet
