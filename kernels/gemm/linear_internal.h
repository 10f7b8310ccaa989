#ifndef RECFLEET_KERNELS_GEMM_LINEAR_INTERNAL_H_
#define RECFLEET_KERNELS_GEMM_LINEAR_INTERNAL_H_

// Device implementations behind linear.h, on validated arguments. All three
// linear GEMMs are one "TN" product C[i, j] = sum_k A[i, k] * B[j, k] whose
// operands are K-major, possibly after transposing a stored matrix:
//   forward: A = x,     B = w         (x: 1x128 blocks, w: 128x128)
//   dgrad:   A = dy,    B = w^T       (dy: 1x128,       w: 128x128)
//   wgrad:   A = dy^T,  B = x^T       (both 1x128 along the rows M)

#include "absl/status/status.h"
#include "kernels/gemm/linear.h"
#include "kernels/quant/quantize.h"
#include "kernels/tensor.h"

namespace recfleet::linear_internal {

// One GEMM operand: the stored matrix, whether the product reads its
// transpose, and how kFp8Block quantizes it: block kind, rounding, and the
// 128-point random Hadamard transform along the reduction dimension (1x128
// blocks of a transposed operand only).
struct Operand {
  TensorView t;
  bool transpose;
  ScaleBlock block;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;
  bool hadamard = false;
  uint64_t hadamard_seed = 0;
};

// The wgrad's random Hadamard transform runs along M in aligned groups of
// kHadamardRows. Both implementations complete a partial last group with
// zero rows of dy and x: the product dy^T x is unchanged (H is orthonormal
// on each group and zero rows add nothing), and no transformed value of the
// group is lost.
constexpr int64_t kHadamardRows = 128;
inline int64_t HadamardPaddedRows(int64_t m) {
  return (m + kHadamardRows - 1) / kHadamardRows * kHadamardRows;
}

// Which GEMM of the layer, so the CUDA side knows which cached operands of a
// LinearContext apply.
enum class GemmRole { kForward, kDgrad, kWgrad };

// The transposed activation operand that forward (x) or dgrad (dy) keeps for
// an FP8 wgrad, quantized as the recipe says.
Operand WgradOperand(const TensorView& t, bool is_dy, const LinearRecipe& recipe);

// c = A B^T (+ bias per column when bias.data) (+ c when accumulate).
absl::Status GemmCpu(const Operand& a, const Operand& b, GemmPrecision precision,
                     const TensorView& bias, bool accumulate, const TensorView& c);
absl::Status GemmCuda(GemmRole role, const Operand& a, const Operand& b, GemmPrecision precision,
                      const TensorView& bias, bool accumulate, const TensorView& c,
                      const LinearRecipe& recipe, void* stream, LinearContext* context);

// dbias (+)= column sums of dy.
absl::Status BiasGradCpu(const TensorView& dy, bool accumulate, const TensorView& dbias);
absl::Status BiasGradCuda(const TensorView& dy, bool accumulate, const TensorView& dbias,
                          void* stream);

}  // namespace recfleet::linear_internal

#endif  // RECFLEET_KERNELS_GEMM_LINEAR_INTERNAL_H_
