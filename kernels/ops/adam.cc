#include "kernels/ops/adam.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "kernels/ops/adam_internal.h"
#include "kernels/ops/check.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {
namespace {

template <typename T>
void Step(const AdamConfig& c, int64_t step, T* p, const T* g, T* m, T* v, int64_t n) {
  const T scale = c.grad_scale.data != nullptr ? c.grad_scale.as<const T>()[0] : T(1);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  const T b1 = T(c.beta1), b2 = T(c.beta2);
  const T step_size = T(c.lr / bc1);
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
  const T decay = T(1.0 - c.lr * c.weight_decay);
  const T wd = T(c.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    T grad = g[i] * scale;
    if (c.decoupled_weight_decay) {
      p[i] *= decay;
    } else {
      grad += wd * p[i];
    }
    m[i] = b1 * m[i] + (T(1) - b1) * grad;
    v[i] = b2 * v[i] + (T(1) - b2) * grad * grad;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + T(c.eps));
  }
}

}  // namespace

absl::Status CheckGradScale(const AdamConfig& config, const TensorView& param) {
  const TensorView& s = config.grad_scale;
  if (s.data == nullptr) return absl::OkStatus();
  if (s.numel() != 1 || s.dtype != param.dtype || s.device != param.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adam grad_scale must be one element of the param's dtype and device, got ", s.DebugString(),
        " for ", param.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckAdamConfig(const AdamConfig& config, int64_t step) {
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("adam step must be >= 1, got ", step));
  if (!(config.lr >= 0) || !(config.beta1 >= 0 && config.beta1 < 1) ||
      !(config.beta2 >= 0 && config.beta2 < 1) || !(config.eps > 0) ||
      !(config.weight_decay >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adam config needs lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got lr=",
        config.lr, " beta1=", config.beta1, " beta2=", config.beta2, " eps=", config.eps,
        " weight_decay=", config.weight_decay));
  }
  return absl::OkStatus();
}

ops_cuda::AdamScalars CudaAdamScalars(const AdamConfig& config, int64_t step) {
  // The scalars as the CPU reference computes them (Step above), rounded to
  // fp32 once.
  const double bc1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
  ops_cuda::AdamScalars s;
  s.beta1 = static_cast<float>(config.beta1);
  s.beta2 = static_cast<float>(config.beta2);
  s.step_size = static_cast<float>(config.lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = static_cast<float>(config.eps);
  s.decay = static_cast<float>(1.0 - config.lr * config.weight_decay);
  s.weight_decay = static_cast<float>(config.weight_decay);
  s.decoupled = config.decoupled_weight_decay;
  s.grad_scale = static_cast<const float*>(config.grad_scale.data);
  return s;
}

absl::Status AdamStep(const AdamConfig& config, int64_t step, const TensorView& param,
                      const TensorView& grad, const TensorView& m, const TensorView& v, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckAdamConfig(config, step));
  RECFLEET_RETURN_IF_ERROR(CheckFloat(param, "param"));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(grad, "grad", param));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(m, "m", param));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(v, "v", param));
  RECFLEET_RETURN_IF_ERROR(CheckGradScale(config, param));
  if (param.device == Device::kCuda) {
    const ops_cuda::AdamScalars s = CudaAdamScalars(config, step);
    return CudaStatus(ops_cuda::AdamStep(s, param.as<float>(), grad.as<const float>(),
                                         m.as<float>(), v.as<float>(), param.numel(), stream),
                      "Adam step");
  }
  if (param.dtype == DType::kFloat64) {
    Step(config, step, param.as<double>(), grad.as<const double>(), m.as<double>(),
         v.as<double>(), param.numel());
  } else {
    Step(config, step, param.as<float>(), grad.as<const float>(), m.as<float>(), v.as<float>(),
         param.numel());
  }
  return absl::OkStatus();
}

}  // namespace recfleet
