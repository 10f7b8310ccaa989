// CPU reference for linear.h: operands converted to the GEMM's precision
// exactly as the CUDA path converts them (FP8 through kernels/quant), then a
// plain triple loop in double.

#include <vector>

#include "kernels/base/checks.h"
#include "kernels/base/formats.h"
#include "kernels/gemm/linear_internal.h"

namespace recfleet::linear_internal {
namespace {

// The K-major matrix [rows, k] the product reads, as doubles, after the
// precision conversion; with the Hadamard transform k is padded to whole
// groups (HadamardPaddedRows).
absl::Status Materialize(const Operand& op, GemmPrecision precision, std::vector<double>* out,
                         int64_t* rows, int64_t* k) {
  const int64_t r0 = op.t.dim(0), c0 = op.t.dim(1);
  *rows = op.transpose ? c0 : r0;
  *k = op.transpose ? r0 : c0;
  const int64_t stored_k = *k;
  if (precision == GemmPrecision::kFp8Block && op.hadamard) *k = HadamardPaddedRows(*k);
  out->assign(*rows * *k, 0.0);
  if (precision == GemmPrecision::kFp8Block) {
    QuantizeConfig cfg;
    cfg.block = op.block;
    cfg.rounding = op.rounding;
    cfg.seed = op.seed;
    TensorView src = op.t;
    bool transpose = op.transpose;
    std::vector<double> transformed;
    if (op.hadamard) {
      // The K-major matrix, zero-padded to whole groups along k (as the
      // CUDA path pads), transformed along k group by group.
      transformed.assign(*rows * *k, 0.0);
      for (int64_t i = 0; i < *rows; ++i) {
        for (int64_t j = 0; j < stored_k; ++j) {
          transformed[i * *k + j] = LoadAsDouble(op.t, op.transpose ? j * c0 + i : i * c0 + j);
        }
      }
      src = MakeView(transformed.data(), DType::kFloat64, {*rows, *k});
      RECFLEET_RETURN_IF_ERROR(RandomHadamard(src, kHadamardRows, op.hadamard_seed, false, src));
      transpose = false;
    }
    std::vector<uint8_t> q(*rows * *k);
    const Shape ss = QuantScaleShape(*rows, *k, op.block);
    std::vector<float> scales(ss[0] * ss[1]);
    const TensorView qv = MakeView(q.data(), cfg.format, {*rows, *k});
    const TensorView sv = MakeView(scales.data(), DType::kFloat32, ss);
    RECFLEET_RETURN_IF_ERROR(Quantize(src, cfg, transpose, qv, sv));
    return Dequantize(qv, sv, op.block, MakeView(out->data(), DType::kFloat64, {*rows, *k}));
  }
  for (int64_t i = 0; i < *rows; ++i) {
    for (int64_t j = 0; j < *k; ++j) {
      const double v = LoadAsDouble(op.t, op.transpose ? j * c0 + i : i * c0 + j);
      (*out)[i * *k + j] = precision == GemmPrecision::kBf16 ? RoundTo(DType::kBFloat16, v) : v;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmCpu(const Operand& a, const Operand& b, GemmPrecision precision,
                     const TensorView& bias, bool accumulate, const TensorView& c) {
  std::vector<double> am, bm;
  int64_t m, n, k, kb;
  RECFLEET_RETURN_IF_ERROR(Materialize(a, precision, &am, &m, &k));
  RECFLEET_RETURN_IF_ERROR(Materialize(b, precision, &bm, &n, &kb));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += am[i * k + l] * bm[j * k + l];
      if (bias.data != nullptr) s += LoadAsDouble(bias, j);
      if (accumulate) s += LoadAsDouble(c, i * n + j);
      StoreFromDouble(c, i * n + j, s);
    }
  }
  return absl::OkStatus();
}

absl::Status BiasGradCpu(const TensorView& dy, bool accumulate, const TensorView& dbias) {
  const int64_t m = dy.dim(0), n = dy.dim(1);
  for (int64_t j = 0; j < n; ++j) {
    double s = accumulate ? LoadAsDouble(dbias, j) : 0.0;
    for (int64_t i = 0; i < m; ++i) s += LoadAsDouble(dy, i * n + j);
    StoreFromDouble(dbias, j, s);
  }
  return absl::OkStatus();
}

}  // namespace recfleet::linear_internal
