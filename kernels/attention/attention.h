#ifndef RECFLEET_KERNELS_ATTENTION_ATTENTION_H_
#define RECFLEET_KERNELS_ATTENTION_ATTENTION_H_

// Jagged attention: one API for every attention the model computes.
//
// Self-attention over the jagged event history (full, causal, sliding window,
// BlockAttention), cross-attention in both directions (long Q to short K/V and
// short Q to long K/V), and PMA (a few learned queries pooling the history)
// are all the same call: Q and K/V are jagged tensors with their own offsets,
// and the options pick the mask and the activation between the two matmuls.
// Nothing is padded: sequence b's queries are rows [q.offsets[b],
// q.offsets[b+1]) of q.values and its keys/values rows [k.offsets[b],
// k.offsets[b+1]) of k.values and v; the two offset arrays share the batch
// size but not the lengths.
//
// The computation, per sequence b and head h (Lq, Lk its lengths):
//
//   q_i, k_j   = the head-h rows, after the optional QK-norm and RoPE below
//   s_ij       = scale * <q_i, k_j> + bias_b[h, i, j]      (bias optional)
//   softmax:     out_i = sum_j p_ij v_j,  p_ij = exp(s_ij) / sum_j' exp(s_ij')
//   gelu, silu:  out_i = sum_j act(s_ij) v_j             (no normalization)
//
// where j ranges over the keys visible to query i under the mask. Positions:
// query i sits at position pq_i = i + (Lk - Lq) ("bottom-right" aligned, as in
// FlashAttention, so causal cross-attention of the last Lq tokens works), key
// j at position j. A query that sees no key (empty K/V, or masked out) gets a
// zero output and lse = -inf.
//
// Devices: every call dispatches on q.values.device. kCpu runs the reference
// (float64 arithmetic inside, exact activations, any head dim, fp64/fp32/bf16
// tensors); kCuda runs the tensor-core kernels (bf16 q/k/v/bias/out/grads,
// fp32 lse, fp32 accumulation, head dim 64 or 128) or, for fp32 tensors, an
// exact-mode fp32 path without tensor cores (any head dim <= 256, no bias;
// cuda_fp32.h) that the fp32 training engine uses. Offsets always live in
// host memory: the launcher plans the tile schedule from them on the host
// (non-empty tiles only, longest first) and caches the plan per device and
// batch, so the first call with new offsets pays for planning and a small
// upload, later calls (every layer, forward and backward) do not. The upload
// is stream-ordered (pinned staging, no wait for the device), so a training
// step with new offsets does not synchronize the host.
// None of the functions allocates caller-visible memory; the CUDA path takes
// stream-ordered temporaries (pre-pass buffers) and frees them on the same
// stream. Calls are thread-safe as long as concurrent calls do not share
// output buffers.
//
// CUDA numerics: GELU uses one tanh.approx per score, x (1 + tanh(x (a +
// b x^2))) / 2 with (a, b) fitted to the exact GELU: error <= 5e-4 + 2.5e-4
// |x| (the fit, then the tanh.approx), its derivative within 2.5e-3, finite
// for |x| < 1e19; SiLU uses one tanh.approx per score. The
// Hopper backward (head dim 64 and 128) adds dQ by TMA reduce-add from the
// dK/dV pass where a key tile streams many query tiles and runs a separate
// dQ pass where it streams few (the rule and its measurements:
// attention_cuda.cc, bench/RESULTS.md); the mma.sync backward's dQ comes
// from a separate pass (RECFLEET_ATTENTION_DQ=atomic: fp32 atomics). BlockAttention with equal Q and K/V lengths runs a
// dedicated kernel with RoPE fused; elsewhere QK-norm and RoPE are row-wise
// pre/post passes. The forward at head dim 64 and 128 (any activation, mask
// and bias; not the fused-RoPE block kernel) runs a Hopper kernel (wgmma
// from shared memory, a TMA/cp.async producer warpgroup feeding two consumer
// warpgroups that take turns on the tensor cores, persistent over the
// longest-first tile plan).
// RECFLEET_ATTENTION_FWD=mma forces the mma.sync kernel everywhere;
// RECFLEET_ATTENTION_WGMMA_TURNS=0, _TMA=0 and _GROUP=0 switch off the
// Hopper kernel's turn-taking, TMA loads and the grouping of query tiles
// that share a short K/V range (for re-measuring).

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet::attention {

// The elementwise function between the two matmuls.
enum class Activation : uint8_t {
  kSoftmax,  // rows normalized over the visible keys (flash attention).
  kGelu,     // exact GELU, x * Phi(x), on each score (GDPA).
  kSilu,     // x * sigmoid(x) on each score (GDPA, HSTU-style).
};

// Which keys a query sees (positions as in the header comment).
enum class Mask : uint8_t {
  kNone,           // every key of the same sequence.
  kCausal,         // keys at j <= pq_i.
  kSlidingWindow,  // keys at pq_i - window < j <= pq_i (causal, `window` keys).
  kBlock,          // BlockAttention: keys in the same 64-token block,
                   // floor(pq_i / 64) == floor(j / 64).
};

// The number format of the forward's matmul operands (AttentionOptions).
enum class ForwardPrecision : uint8_t {
  kBf16,     // q, k, v as given (bf16).
  kFp8E4M3,  // block-scaled FP8: q, k, v quantized to e4m3 with power-of-two
             // scales by a pre-pass (q per token and head over head_dim, k
             // and v per head and channel, k's folded into q) and P after
             // the exponent with a fixed scale; fp32 accumulation, bf16 out
             // (cuda_kernels.h, Fp8Operands; cuda_wgmma_fp8.cu).
};

// The number format of the backward's matmul operands (AttentionOptions).
enum class BackwardPrecision : uint8_t {
  kBf16,     // q, k, v, dout as given (bf16).
  kFp8E4M3,  // block-scaled FP8: every GEMM of the backward on e4m3 operands
             // with power-of-two scales (q, dout per token and head, k, v
             // and the transposed copies per head and channel, P with a fixed
             // scale, dS per row with a scale that grows lazily); fp32
             // accumulation, bf16 gradients (cuda_wgmma_fp8_bwd.cu).
};

// The block size of Mask::kBlock.
inline constexpr int64_t kAttentionBlockSize = 64;
// epsilon of the QK-norm: x / sqrt(|x|^2 + kQkNormEpsilon).
inline constexpr double kQkNormEpsilon = 1e-6;

struct AttentionOptions {
  Activation activation = Activation::kSoftmax;
  Mask mask = Mask::kNone;
  // Width W of Mask::kSlidingWindow (>= 1); ignored by the other masks.
  int64_t window = 0;
  // Multiplies <q, k>. 0 means 1 / sqrt(head_dim).
  double scale = 0.0;
  // L2-normalizes every q and k head vector before the dot product, so that
  // |s_ij - bias| <= |scale|.
  bool qk_norm = false;
  // Rotary position embedding (rotate-half / GPT-NeoX pairing: element c is
  // paired with c + d/2, angle = position * rope_theta^(-2c/d)), applied to
  // q and k after the QK-norm, at the positions pq_i and j defined above.
  bool rope = false;
  double rope_theta = 10000.0;
  // Forward only, CUDA bf16 tensors: kFp8E4M3 runs the FP8 forward (softmax,
  // head_dim 128, no bias, a positive scale, any mask but kBlock), whose
  // output is within a few percent of the bf16 forward's (attention_fp8_
  // cuda_test states the bound). The backward ignores it (backward_precision).
  ForwardPrecision forward_precision = ForwardPrecision::kBf16;
  // Backward only, with the same conditions as forward_precision:
  // kFp8E4M3 runs the FP8 backward, whose gradients are within ~4-7.5% (of
  // their norm) of the exact ones on N(0, 1) data (attention_fp8_cuda_test
  // states the bound). Independent of forward_precision: the backward reads the
  // forward's bf16 output and lse either way.
  BackwardPrecision backward_precision = BackwardPrecision::kBf16;
  // CUDA only: the cudaStream_t to run on (nullptr: the default stream).
  void* cuda_stream = nullptr;
};

// The inputs of one call. All value tensors are rank 3 [rows, heads, head_dim]
// with the same heads H and head_dim d and the same dtype and device.
struct AttentionInputs {
  JaggedView q;  // values [total_q, H, d]; offsets [B + 1] on the host.
  JaggedView k;  // values [total_kv, H, d]; offsets [B + 1] on the host.
  TensorView v;  // [total_kv, H, d]; its rows follow k.offsets.
  // Optional additive bias (data == nullptr: none). Rank 1, holding for each
  // sequence b in order a row-major [H, Lq_b, Lk_b] block, so its length is
  // H * sum_b Lq_b * Lk_b. Same dtype and device as q. BiasLength() gives the
  // expected length.
  TensorView bias;
  // The backward may overwrite q's and k's values: the caller reads them no
  // more after AttentionBackward. Where the CUDA kernels read a transform of
  // q and k whose backward needs no input (RoPE without QK-norm on the
  // jagged kernels), the backward then rotates them in place instead of into
  // two temporaries of their size, which lowers the memory peak of a
  // training step's attention backward. Ignored by the forward and the CPU.
  bool qk_writable = false;
};

// Gradients of a scalar loss with respect to the inputs; shapes and dtypes
// as the corresponding inputs. dbias may be empty (skipped) even when a bias
// was given, and must be empty when none was.
struct AttentionGrads {
  TensorView dq;
  TensorView dk;
  TensorView dv;
  TensorView dbias;
};

// H * sum_b Lq_b * Lk_b for the given offsets (host memory), i.e. the number
// of bias elements the inputs need.
int64_t BiasLength(const JaggedView& q, const JaggedView& k, int64_t heads);

// Validates the inputs and options (shapes, dtypes, devices, offsets, head dim
// support of the device) without computing anything.
absl::Status ValidateAttention(const AttentionInputs& in, const AttentionOptions& opts);

// out [total_q, H, d] (dtype of q) = attention(in). lse [total_q, H] fp32 (or
// fp64 on the CPU) receives log sum_j exp(s_ij) per row for the softmax
// activation, which the backward needs; it must be empty (data == nullptr)
// for GELU and SiLU.
absl::Status AttentionForward(const AttentionInputs& in, const AttentionOptions& opts,
                              TensorView out, TensorView lse);

// Gradients given d_out = dLoss/dout. `out` and `lse` are the forward's
// outputs for the same inputs and options (lse empty unless softmax). All of
// dq, dk, dv are overwritten (not accumulated into).
absl::Status AttentionBackward(const AttentionInputs& in, const AttentionOptions& opts,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& d_out, const AttentionGrads& grads);

// Useful floating-point operations of a forward call, counted from the real
// jagged lengths and the mask (4 * d per visible query/key pair: two matmuls
// of 2 * d each). The backward is 2.5x the forward by the usual convention.
double AttentionForwardFlops(const JaggedView& q, const JaggedView& k, int64_t heads,
                             int64_t head_dim, const AttentionOptions& opts);

}  // namespace recfleet::attention

#endif  // RECFLEET_KERNELS_ATTENTION_ATTENTION_H_
