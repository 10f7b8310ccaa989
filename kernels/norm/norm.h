#ifndef RECFLEET_KERNELS_NORM_NORM_H_
#define RECFLEET_KERNELS_NORM_NORM_H_

// RMSNorm and LayerNorm over the last dimension, forward and backward.
//
// Tensors: x, y, dy, dx have shape [..., dim] (any rank >= 1; all leading
// dimensions are flattened into `rows`) and dtype fp32 or bf16 (fp64 on the
// CPU); gamma and beta are [dim] fp32 or bf16 (fp64 on CPU). The forward
// saves per-row statistics for the backward: rstd (and mean for LayerNorm),
// [rows] fp32 (fp64 on CPU). Parameter gradients dgamma/dbeta are [dim] fp32
// (fp64 on CPU) and are overwritten, not accumulated. Statistics and
// reductions are computed in fp32 on CUDA and double on CPU.
//
//   RMSNorm:   rstd = 1/sqrt(mean(x^2) + eps),         y = x * rstd * gamma
//   LayerNorm: rstd = 1/sqrt(var(x) + eps) (biased),   y = (x - mean) * rstd * gamma + beta
//
// Devices: all tensors of a call on one Device; the call dispatches on it.
// CUDA work is enqueued on `stream` (cudaStream_t; nullptr = legacy default
// stream) and is asynchronous. Calls are reentrant and thread-compatible.

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet {

absl::Status RmsNormForward(const TensorView& x, const TensorView& gamma, float eps,
                            const TensorView& y, const TensorView& rstd, void* stream = nullptr);

absl::Status RmsNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                             const TensorView& rstd, const TensorView& dx,
                             const TensorView& dgamma, void* stream = nullptr);

absl::Status LayerNormForward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                              float eps, const TensorView& y, const TensorView& mean,
                              const TensorView& rstd, void* stream = nullptr);

absl::Status LayerNormBackward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                               const TensorView& mean, const TensorView& rstd,
                               const TensorView& dx, const TensorView& dgamma,
                               const TensorView& dbeta, void* stream = nullptr);

// Forward passes that emit FP8 directly (fusing the quantization of the
// next FP8 GEMM's input into the norm): y is [..., dim] fp8 (E4M3 or E5M2),
// y_scales [rows, ceil(dim / 128)] fp32 are its 1x128 block scales, exactly
// as kernels/quant Quantize(ScaleBlock::k1x128, round-to-nearest) would
// produce from the fp32 norm output.
absl::Status RmsNormForwardFp8(const TensorView& x, const TensorView& gamma, float eps,
                               const TensorView& y, const TensorView& y_scales,
                               const TensorView& rstd, void* stream = nullptr);

absl::Status LayerNormForwardFp8(const TensorView& x, const TensorView& gamma,
                                 const TensorView& beta, float eps, const TensorView& y,
                                 const TensorView& y_scales, const TensorView& mean,
                                 const TensorView& rstd, void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_NORM_NORM_H_
