#include "kernels/ops/activation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "kernels/ops/check.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <typename T>
T Sigmoid(T x) {
  return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

template <typename T>
void Forward(Activation act, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    switch (act) {
      case Activation::kRelu:
        y[i] = v > 0 ? v : T(0);
        break;
      case Activation::kGelu:
        y[i] = T(0.5) * v * (T(1) + std::erf(v * T(kInvSqrt2)));
        break;
      case Activation::kSilu:
        y[i] = v * Sigmoid(v);
        break;
    }
  }
}

template <typename T>
void Backward(Activation act, const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    T d = 0;
    switch (act) {
      case Activation::kRelu:
        d = v > 0 ? T(1) : T(0);
        break;
      case Activation::kGelu:
        d = T(0.5) * (T(1) + std::erf(v * T(kInvSqrt2))) + v * T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
        break;
      case Activation::kSilu: {
        const T s = Sigmoid(v);
        d = s * (T(1) + v * (T(1) - s));
        break;
      }
    }
    dx[i] = dy[i] * d;
  }
}

}  // namespace

absl::string_view ActivationName(Activation act) {
  switch (act) {
    case Activation::kRelu: return "relu";
    case Activation::kGelu: return "gelu";
    case Activation::kSilu: return "silu";
  }
  return "unknown";
}

absl::StatusOr<Activation> ParseActivation(absl::string_view name) {
  for (Activation a : {Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
    if (name == ActivationName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("activation must be relu, gelu or silu, got '", name, "'"));
}

absl::Status ActivationForward(Activation act, const TensorView& x, const TensorView& y,
                               void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFloat(x, "x", /*bf16_on_cuda=*/true));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(y, "y", x));
  if (x.device == Device::kCuda) {
    return CudaStatus(ops_cuda::ActivationForward(static_cast<int>(act), x.data, y.data,
                                                  x.dtype == DType::kBFloat16 ? 1 : 0, x.numel(),
                                                  stream),
                      "activation forward");
  }
  if (x.dtype == DType::kFloat64) {
    Forward(act, x.as<const double>(), y.as<double>(), x.numel());
  } else {
    Forward(act, x.as<const float>(), y.as<float>(), x.numel());
  }
  return absl::OkStatus();
}

absl::Status ActivationBackward(Activation act, const TensorView& x, const TensorView& dy,
                                const TensorView& dx, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFloat(x, "x", /*bf16_on_cuda=*/true));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(dy, "dy", x));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(dx, "dx", x));
  if (x.device == Device::kCuda) {
    return CudaStatus(ops_cuda::ActivationBackward(static_cast<int>(act), x.data, dy.data, dx.data,
                                                   x.dtype == DType::kBFloat16 ? 1 : 0, x.numel(),
                                                   stream),
                      "activation backward");
  }
  if (x.dtype == DType::kFloat64) {
    Backward(act, x.as<const double>(), dy.as<const double>(), dx.as<double>(), x.numel());
  } else {
    Backward(act, x.as<const float>(), dy.as<const float>(), dx.as<float>(), x.numel());
  }
  return absl::OkStatus();
}

}  // namespace recfleet
