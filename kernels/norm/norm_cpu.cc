// CPU reference for norm.h: two passes per row, double accumulation.

#include <cmath>
#include <vector>

#include "kernels/base/formats.h"
#include "kernels/norm/norm_internal.h"
#include "kernels/quant/quantize.h"

namespace recfleet::norm_internal {

absl::Status ForwardCpu(const NormArgs& a, const TensorView& x, const TensorView& gamma,
                        const TensorView& beta, float eps, const TensorView& y,
                        const TensorView& y_scales, const TensorView& mean,
                        const TensorView& rstd) {
  // An FP8 output is the fp32 result quantized in 1x128 blocks.
  std::vector<float> y32;
  const bool fp8 = y_scales.data != nullptr;
  if (fp8) y32.resize(a.rows * a.dim);
  const TensorView out = fp8 ? MakeView(y32.data(), DType::kFloat32, {a.rows, a.dim}) : y;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t base = r * a.dim;
    double mu = 0;
    if (a.layer_norm) {
      for (int64_t d = 0; d < a.dim; ++d) mu += LoadAsDouble(x, base + d);
      mu /= static_cast<double>(a.dim);
    }
    double sq = 0;
    for (int64_t d = 0; d < a.dim; ++d) {
      const double c = LoadAsDouble(x, base + d) - mu;
      sq += c * c;
    }
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(a.dim) + static_cast<double>(eps));
    for (int64_t d = 0; d < a.dim; ++d) {
      double v = (LoadAsDouble(x, base + d) - mu) * rs * LoadAsDouble(gamma, d);
      if (a.layer_norm) v += LoadAsDouble(beta, d);
      StoreFromDouble(out, base + d, v);
    }
    if (a.layer_norm) StoreFromDouble(mean, r, mu);
    StoreFromDouble(rstd, r, rs);
  }
  if (!fp8) return absl::OkStatus();
  QuantizeConfig cfg;
  cfg.block = ScaleBlock::k1x128;
  cfg.format = y.dtype;
  TensorView q = y;
  q.shape = {a.rows, a.dim};
  return Quantize(out, cfg, false, q, y_scales);
}

absl::Status BackwardCpu(const NormArgs& a, const TensorView& dy, const TensorView& x,
                         const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                         const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta) {
  std::vector<double> dg(a.dim, 0.0), db(a.dim, 0.0), xhat(a.dim), g(a.dim);
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t base = r * a.dim;
    const double mu = a.layer_norm ? LoadAsDouble(mean, r) : 0.0;
    const double rs = LoadAsDouble(rstd, r);
    // With xhat = (x - mu) * rstd and g = dy * gamma:
    //   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (LayerNorm)
    //   dx = rstd * (g - xhat * mean(g * xhat))             (RMSNorm)
    double mean_g = 0, mean_gx = 0;
    for (int64_t d = 0; d < a.dim; ++d) {
      const double gy = LoadAsDouble(dy, base + d);
      xhat[d] = (LoadAsDouble(x, base + d) - mu) * rs;
      g[d] = gy * LoadAsDouble(gamma, d);
      mean_g += g[d];
      mean_gx += g[d] * xhat[d];
      dg[d] += gy * xhat[d];
      db[d] += gy;
    }
    mean_g = a.layer_norm ? mean_g / static_cast<double>(a.dim) : 0.0;
    mean_gx /= static_cast<double>(a.dim);
    for (int64_t d = 0; d < a.dim; ++d) {
      StoreFromDouble(dx, base + d, rs * (g[d] - mean_g - xhat[d] * mean_gx));
    }
  }
  for (int64_t d = 0; d < a.dim; ++d) {
    StoreFromDouble(dgamma, d, dg[d]);
    if (a.layer_norm) StoreFromDouble(dbeta, d, db[d]);
  }
  return absl::OkStatus();
}

}  // namespace recfleet::norm_internal
