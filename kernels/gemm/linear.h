#ifndef RECFLEET_KERNELS_GEMM_LINEAR_H_
#define RECFLEET_KERNELS_GEMM_LINEAR_H_

// Linear layer y = x W^T + b: forward and both backward GEMMs, each run at the
// precision a LinearRecipe picks for it.
//
// Shapes (PyTorch layout, row-major): x [M, K], w [N, K], bias [N], y [M, N];
// backward: dy [M, N] -> dx [M, K] (= dy W) and dw [N, K] (= dy^T x),
// dbias [N] (= column sums of dy). x/w/y/dy/dx/dw are fp32 or bf16 (fp64 on
// the CPU); bias/dbias are fp32 (fp64 on CPU) or bf16.
//
// Precision of one GEMM (operands are converted to it, products accumulate
// in fp32 on CUDA and double on CPU, the result is rounded once to the
// output dtype):
//   kNative:   operands as stored (fp32 GEMMs run in full fp32).
//   kBf16:     operands rounded to bf16.
//   kFp8Block: operands quantized to FP8 E4M3 with fine-grained fp32 scales:
//              activations and output gradients in 1x128 blocks along the
//              reduction dimension, weights in 128x128 blocks (DeepSeek-V3
//              style; see kernels/quant/quantize.h). The CPU reference
//              performs exactly the same quantization and then multiplies
//              in double, so it is the numerics reference for the CUDA path.
// GEM's recipe keeps sensitive pieces (some weight gradients, late layers) in
// bf16; the default recipe is all bf16.
//
// Devices: all tensors of one call on one Device; the call dispatches on it.
// CUDA GEMMs run through cuBLASLt on `stream` (cudaStream_t; nullptr = legacy
// default stream), asynchronously; FP8 operand quantization takes temporary
// device memory with cudaMallocAsync on that stream. Calls are reentrant
// (one cuBLASLt handle per thread; workspaces are stream-ordered per call).
// CUDA limits: kFp8Block needs m, n and k divisible by 16; kNative needs both
// operands of one dtype (and an fp32 output for fp32 operands); otherwise
// InvalidArgument names the fix.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace recfleet {

enum class GemmPrecision : uint8_t { kNative, kBf16, kFp8Block };

absl::string_view GemmPrecisionName(GemmPrecision p);  // "native", "bf16", "fp8_block"

// Per-GEMM precision of one linear layer.
struct LinearRecipe {
  GemmPrecision forward = GemmPrecision::kBf16;  // y  = x W^T
  GemmPrecision dgrad = GemmPrecision::kBf16;    // dx = dy W
  GemmPrecision wgrad = GemmPrecision::kBf16;    // dw = dy^T x
};

// y = x W^T (+ bias when bias.data != nullptr). y is overwritten.
absl::Status LinearForward(const TensorView& x, const TensorView& w, const TensorView& bias,
                           const TensorView& y, const LinearRecipe& recipe,
                           void* stream = nullptr);

// dx = dy W. dx is overwritten.
absl::Status LinearBackwardInput(const TensorView& dy, const TensorView& w, const TensorView& dx,
                                 const LinearRecipe& recipe, void* stream = nullptr);

// dw (+)= dy^T x and, when dbias.data != nullptr, dbias (+)= sum over rows of
// dy. With accumulate = true the results are added to dw/dbias (gradient
// accumulation over micro-batches); otherwise they are overwritten.
absl::Status LinearBackwardWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                                  const TensorView& dbias, bool accumulate,
                                  const LinearRecipe& recipe, void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_GEMM_LINEAR_H_
