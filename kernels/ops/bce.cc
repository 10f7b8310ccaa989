#include "kernels/ops/bce.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "kernels/ops/check.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {
namespace {

absl::Status CheckInputs(const TensorView& logits, const TensorView& labels) {
  RECFLEET_RETURN_IF_ERROR(CheckFloat(logits, "logits"));
  RECFLEET_RETURN_IF_ERROR(CheckRank(logits, "logits", 1));
  return CheckSameLayout(labels, "labels", logits);
}

template <typename T>
void Forward(const T* z, const T* y, T* loss, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    loss[i] = std::max(z[i], T(0)) - z[i] * y[i] + std::log1p(std::exp(-std::abs(z[i])));
  }
}

template <typename T>
void Backward(const T* z, const T* y, const T* dloss, T* dz, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = z[i] >= 0 ? T(1) / (T(1) + std::exp(-z[i]))
                          : std::exp(z[i]) / (T(1) + std::exp(z[i]));
    dz[i] = dloss[i] * (s - y[i]);
  }
}

}  // namespace

absl::Status BceWithLogitsForward(const TensorView& logits, const TensorView& labels,
                                  const TensorView& loss, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckInputs(logits, labels));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(loss, "loss", logits));
  if (logits.device == Device::kCuda) {
    return CudaStatus(ops_cuda::BceForward(logits.as<const float>(), labels.as<const float>(),
                                           loss.as<float>(), logits.numel(), stream),
                      "BCE forward");
  }
  if (logits.dtype == DType::kFloat64) {
    Forward(logits.as<const double>(), labels.as<const double>(), loss.as<double>(),
            logits.numel());
  } else {
    Forward(logits.as<const float>(), labels.as<const float>(), loss.as<float>(), logits.numel());
  }
  return absl::OkStatus();
}

absl::Status BceWithLogitsBackward(const TensorView& logits, const TensorView& labels,
                                   const TensorView& dloss, const TensorView& dlogits,
                                   void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckInputs(logits, labels));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(dloss, "dloss", logits));
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(dlogits, "dlogits", logits));
  if (logits.device == Device::kCuda) {
    return CudaStatus(ops_cuda::BceBackward(logits.as<const float>(), labels.as<const float>(),
                                            dloss.as<const float>(), dlogits.as<float>(),
                                            logits.numel(), stream),
                      "BCE backward");
  }
  if (logits.dtype == DType::kFloat64) {
    Backward(logits.as<const double>(), labels.as<const double>(), dloss.as<const double>(),
             dlogits.as<double>(), logits.numel());
  } else {
    Backward(logits.as<const float>(), labels.as<const float>(), dloss.as<const float>(),
             dlogits.as<float>(), logits.numel());
  }
  return absl::OkStatus();
}

}  // namespace recfleet
