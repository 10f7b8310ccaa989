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
// bf16; the default recipe is all bf16. An FP8 weight gradient can further
// spread outliers with a random Hadamard transform along M (the reduction
// dimension of dw = dy^T x: both operands are transformed, which leaves the
// product unchanged up to rounding) and round dy stochastically (unbiased).
// The transform works on groups of 128 rows; any M is taken, a partial last
// group being completed with zero rows of dy and x (the product is
// unchanged: zero rows add nothing).
//
// Reuse of quantized operands (CUDA, optional): a LinearContext passed to the
// three calls of one layer keeps
//   - the FP8 weight and its transpose (128x128 blocks are transpose-
//     invariant, so both come from one pass over w), made on first use and
//     again after InvalidateWeight(): call it after every optimizer step or
//     any other write to w;
//   - x^T (when wgrad is kFp8Block): LinearForward quantizes x and x^T in
//     one pass, and the next LinearBackwardWeight whose x has the same data
//     pointer and shape (and wgrad options and seed) uses that x^T once;
//   - dy^T likewise, from LinearBackwardInput;
//   - with a kBf16 wgrad after FP8 forward and dgrad, bf16 copies of an fp32
//     x and dy, written by the passes that quantize them (one read of each
//     instead of two); the wgrad uses them once, and every LinearForward
//     drops both (device memory: 2 bytes per element of x and of dy, kept).
// With the Hadamard transform and M not a multiple of 128, x^T and dy^T are
// not kept: the wgrad quantizes zero-padded copies of x and dy itself.
// x and dy must not change between those calls. Without a context every
// FP8 GEMM quantizes its operands itself.
//
// Devices: all tensors of one call on one Device; the call dispatches on it.
// CUDA GEMMs run through cuBLASLt on `stream` (cudaStream_t; nullptr = legacy
// default stream), asynchronously; FP8 operand quantization takes temporary
// device memory with cudaMallocAsync on that stream. Calls are reentrant
// (one cuBLASLt handle per thread; workspaces are stream-ordered per call).
// The first GEMM of each shape and precision on a thread whose M and N are
// multiples of 128 (shapes that recur: dense layers, experts, benchmarks)
// times cuBLASLt's candidate algorithms (up to 8) on `stream` and keeps the
// fastest: that call waits for the stream, and two processes may pick
// different algorithms (results then differ in the last bits). Other shapes
// (jagged token counts, new with every batch, also where a Hadamard wgrad
// pads them) and calls under stream capture keep the heuristic's first
// choice, so a step never waits for a search. The per-thread choice cache
// is cleared at 4,096 shapes.
// CUDA limits: kFp8Block needs m, n and k divisible by 16 (a Hadamard wgrad
// takes any M: its reduction dimension is padded to a multiple of 128, in
// stream-ordered temporaries); kNative needs both operands of one dtype (and
// an fp32 output for fp32 operands); otherwise InvalidArgument names the fix.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace recfleet {

enum class GemmPrecision : uint8_t { kNative, kBf16, kFp8Block };

absl::string_view GemmPrecisionName(GemmPrecision p);  // "native", "bf16", "fp8_block"

// Whether the kFp8Block GEMMs take a weight of [n, k] (both multiples of
// 16; see "CUDA limits" above). A layer whose weight they do not take keeps
// its model's precision (engine/layers/linear.h), and so does the FSDP
// all-gather of that weight (worker/distributed_model.h).
inline bool Fp8GemmTakesWeight(int64_t n, int64_t k) { return n % 16 == 0 && k % 16 == 0; }

// Per-GEMM precision of one linear layer.
struct LinearRecipe {
  GemmPrecision forward = GemmPrecision::kBf16;  // y  = x W^T
  GemmPrecision dgrad = GemmPrecision::kBf16;    // dx = dy W
  GemmPrecision wgrad = GemmPrecision::kBf16;    // dw = dy^T x
  // kFp8Block wgrad only. Hadamard: 128-point random Hadamard transform of
  // dy and x along M (any M: a partial last group is zero-padded), signs
  // from `seed`. Stochastic: dy's FP8 rounded stochastically with `seed` (x
  // keeps round-to-nearest).
  bool wgrad_hadamard = false;
  bool wgrad_stochastic = false;
  uint64_t seed = 0;  // use a new one per step
};

// Quantized operands kept between the calls of one linear layer (see the
// top of this file). CUDA only; device memory is allocated on first use
// (cudaMalloc) and freed by the destructor, which synchronizes the device.
// Not thread-safe: one context per layer and stream.
class LinearContext {
 public:
  LinearContext();
  ~LinearContext();
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;

  // The weight changed: the next FP8 GEMM re-quantizes it.
  void InvalidateWeight();

  // Hands the context the FP8 form of the weight w [N, K] made elsewhere
  // (FSDP's FP8 all-gather, worker/dist/fp8_all_gather.h): `codes` [N, K]
  // E4M3 and `tile_scales` [TileCount(N, K)] fp32, row-major over the
  // 128x128 tiles, as kernels/quant/
  // quantize.h's k128x128 Quantize (and its tiled pieces) code and scale a
  // weight. The FP8 GEMMs of the next calls on w (same data pointer and
  // shape) use them and their transpose instead of quantizing w, until
  // InvalidateWeight. When the codes are Quantize(w)'s, the GEMMs compute
  // exactly what they would have; when w is only their dequantized copy,
  // this skips a second rounding (re-quantizing the copy may move a tile's
  // scale in its last bits). Codes and scales are copied (stream-ordered on
  // `stream`, a cudaStream_t); CUDA only.
  absl::Status SetWeight(const TensorView& w, const TensorView& codes,
                         const TensorView& tile_scales, void* stream = nullptr);

  // The cached operands; only the implementation (linear_cuda.cc) sees
  // inside.
  struct State;
  State* state() { return state_; }

 private:
  State* state_;
};

// y = x W^T (+ bias when bias.data != nullptr). y is overwritten.
absl::Status LinearForward(const TensorView& x, const TensorView& w, const TensorView& bias,
                           const TensorView& y, const LinearRecipe& recipe,
                           void* stream = nullptr, LinearContext* context = nullptr);

// dx = dy W. dx is overwritten.
absl::Status LinearBackwardInput(const TensorView& dy, const TensorView& w, const TensorView& dx,
                                 const LinearRecipe& recipe, void* stream = nullptr,
                                 LinearContext* context = nullptr);

// dx += dy W, the sum taken in the GEMM's epilogue (accumulated in fp32,
// rounded once to dx's dtype): for an input that feeds several layers, whose
// gradients would otherwise each go through a scratch buffer and an add.
absl::Status LinearBackwardInputAccumulate(const TensorView& dy, const TensorView& w,
                                           const TensorView& dx, const LinearRecipe& recipe,
                                           void* stream = nullptr,
                                           LinearContext* context = nullptr);

// dw (+)= dy^T x and, when dbias.data != nullptr, dbias (+)= sum over rows of
// dy. With accumulate = true the results are added to dw/dbias (gradient
// accumulation over micro-batches); otherwise they are overwritten.
absl::Status LinearBackwardWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                                  const TensorView& dbias, bool accumulate,
                                  const LinearRecipe& recipe, void* stream = nullptr,
                                  LinearContext* context = nullptr);

// dbias (+)= sum over rows of dy [M, N] alone (what LinearBackwardWeight
// does with a dbias): for callers that hand the wgrad GEMM a rounded copy of
// dy but want the bias gradient from dy itself.
absl::Status LinearBackwardBias(const TensorView& dy, const TensorView& dbias, bool accumulate,
                                void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_GEMM_LINEAR_H_
