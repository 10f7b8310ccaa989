// CUDA side of norm.h: maps validated views onto the kernels.

#include "kernels/base/cuda_status.h"
#include "kernels/norm/norm_internal.h"
#include "kernels/norm/norm_kernels.h"

namespace recfleet::norm_internal {
namespace {

int TypeCode(const TensorView& t) { return t.dtype == DType::kBFloat16 ? 1 : 0; }

norm_cuda::Shape ShapeOf(const NormArgs& a) { return {a.rows, a.dim, a.layer_norm}; }

}  // namespace

absl::Status ForwardCuda(const NormArgs& a, const TensorView& x, const TensorView& gamma,
                         const TensorView& beta, float eps, const TensorView& y,
                         const TensorView& y_scales, const TensorView& mean,
                         const TensorView& rstd, void* stream) {
  int fp8 = 0;
  if (y_scales.data != nullptr) fp8 = y.dtype == DType::kFloat8E5M2 ? 2 : 1;
  return CudaStatus(
      norm_cuda::Forward(ShapeOf(a), x.data, TypeCode(x), gamma.data, TypeCode(gamma), beta.data,
                         TypeCode(beta), eps, y.data, TypeCode(y), fp8, y_scales.as<float>(),
                         mean.as<float>(), rstd.as<float>(), stream),
      a.layer_norm ? "LayerNorm forward" : "RMSNorm forward");
}

absl::Status BackwardCuda(const NormArgs& a, const TensorView& dy, const TensorView& x,
                          const TensorView& gamma, const TensorView& mean, const TensorView& rstd,
                          const TensorView& dx, const TensorView& dgamma, const TensorView& dbeta,
                          void* stream) {
  return CudaStatus(
      norm_cuda::Backward(ShapeOf(a), dy.data, TypeCode(dy), x.data, TypeCode(x), gamma.data,
                          TypeCode(gamma), mean.as<float>(), rstd.as<float>(), dx.data,
                          TypeCode(dx), dgamma.as<float>(),
                          a.layer_norm ? dbeta.as<float>() : nullptr, stream),
      a.layer_norm ? "LayerNorm backward" : "RMSNorm backward");
}

}  // namespace recfleet::norm_internal
