#ifndef RECFLEET_ENGINE_LAYERS_ATTENTION_H_
#define RECFLEET_ENGINE_LAYERS_ATTENTION_H_

// The attention layers of GEM-lite (DESIGN section 2), all on jagged
// activations [rows, dim] whose rows follow host int64 offsets [B + 1]:
//
//   JaggedAttention     one kernel call (no parameters) with the tensors its
//                       backward needs; the piece the others are made of.
//   SelfAttentionBlock  the sequence branch's pre-norm block:
//                       y = x + O(attn(Q n, K n, V n)), n = RmsNorm(x).
//   CrossAttention      non-sequence tokens attend to the history:
//                       y = t + O(attn(Q t, K h, V h)).
//   Pma                 P learned queries per sample pool the history:
//                       y = O(attn(queries, K h, V h)), [B * P, dim].
//
// Conventions of engine/layers/layer.h. Linear names follow the checkpoint
// names: `name`.q/.k/.v (no bias), `name`.o (bias), `name`.norm, and
// `name`.queries for PMA.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/layers/parameters.h"
#include "engine/tensor.h"
#include "kernels/attention/attention.h"

namespace recfleet::engine::layers {

class JaggedAttention {
 public:
  JaggedAttention(const LayerContext& ctx, int64_t heads, const attention::AttentionOptions& options);

  // out [Lq, dim] = attention of q [Lq, dim] (rows by q_offsets) over k, v
  // [Lk, dim] (rows by k_offsets); dim = heads * head_dim. Keeps the views
  // of q, k, v, the offsets and out, and counts the kernel's FLOPs.
  absl::Status Forward(const JaggedView& q, const JaggedView& k, const TensorView& v, Tensor* out);
  // Overwrites dq, dk, dv (shapes of q, k, v) given d_out. With
  // `qk_writable` the caller reads the forward's q and k no more, and the
  // kernels may overwrite them (AttentionInputs::qk_writable: RoPE rotated
  // in place instead of into two temporaries).
  absl::Status Backward(const TensorView& d_out, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, bool qk_writable = false);

  // Drops what the forward kept for the backward (the softmax statistics,
  // the bf16 copies): a layer that recomputes its activations calls it
  // after its forward and runs Forward again before Backward.
  void ReleaseSaved();
  // Selective recomputation, keeping the output and the softmax statistics:
  // ReleaseInputCopies drops the bf16 copies of q, k, v (fp32 q, k, v on the
  // bf16 kernels); RebindInputs points the backward at recomputed q, k, v of
  // the same values (remaking those copies); RebindOutput at a copy of the
  // output (e.g. dequantized from FP8). The backward then reads them in
  // place of the forward's tensors.
  void ReleaseInputCopies();
  absl::Status RebindInputs(const JaggedView& q, const JaggedView& k, const TensorView& v);
  void RebindOutput(const TensorView& out) { out_ = out; }
  // Bytes of what the forward keeps for the backward; of them, the softmax
  // statistics.
  int64_t SavedBytes() const;
  int64_t StatisticsBytes() const;

  // Whether calls run on the bf16 kernels: ctx.bf16_attention (or an FP8
  // forward, whose backward is bf16) and a head dim they support (64 or
  // 128); other head dims stay in fp32.
  bool Bf16(int64_t head_dim) const;
  // Whether the forward runs the FP8 kernel (options.forward_precision);
  // the backward then runs the bf16 one on the bf16 q, k, v and the FP8
  // forward's output and statistics.
  bool Fp8() const;
  // Whether a layer built on this attention keeps its inner activations and
  // their gradients in bf16 (the "bf16 flow"): CUDA, the bf16 kernels for
  // this head dim, and an all-bf16 linear recipe, so that the projections
  // write bf16 q, k, v, the attention reads and writes bf16, and nothing
  // between layers that round to bf16 anyway makes an fp32 round trip.
  bool Bf16Flow(const TensorView& x, int64_t dim) const;

 private:
  attention::AttentionInputs Inputs() const;
  // options_ with a bf16 forward precision (the backward has no FP8 kernel).
  attention::AttentionOptions BackwardOptions() const;

  LayerContext ctx_;
  int64_t heads_;
  attention::AttentionOptions options_;
  JaggedView q_, k_;
  TensorView v_, out_;
  Tensor lse_;
  // bf16 copies for ctx.bf16_attention: inputs and output of the forward,
  // then the backward's gradients.
  Tensor q16_, k16_, v16_, out16_, do16_, dq16_, dk16_, dv16_;
};

// What a self-attention block keeps from its forward for its backward
// (activation checkpointing), from the most kept to the least; each level
// also drops what the one before it drops. Per block of [L, dim] rows, in
// units of one [L, dim] activation A (bf16 with the bf16 flow):
//   kNone         keeps the norm's output, q, k, v, the attention output and
//                 its statistics ([L, heads] fp32): 5 A.
//   kNorm         drops the norm's output; the backward recomputes it from
//                 the input (one elementwise pass) once the attention's
//                 backward, where the block's memory peaks, is done:
//                 keeps 4 A.
//   kProjections  also drops q, k, v; the backward recomputes them (three
//                 [L, dim] x [dim, dim] GEMMs): keeps the attention output
//                 and its statistics, 1 A.
//   kBlock        keeps nothing but the input; the backward recomputes the
//                 norm, q, k, v and the attention (not o's output: only its
//                 input is needed), 0 A.
// The input itself (1 A, the residual stream) is kept in every mode: the
// norm's backward reads it.
enum class BlockCheckpoint { kNone = 0, kNorm = 1, kProjections = 2, kBlock = 3 };
absl::string_view BlockCheckpointName(BlockCheckpoint mode);  // "none", "norm", ...
absl::StatusOr<BlockCheckpoint> ParseBlockCheckpoint(absl::string_view name);

// The bytes a self-attention block holds from its forward for its backward,
// by kind (SelfAttentionBlock::Saved).
struct BlockSavedBytes {
  int64_t input = 0;       // The input: its FP8 copy, or the caller's tensor (a view).
  int64_t normed = 0;      // The norm's output.
  int64_t qkv = 0;         // q, k, v (and the attention's bf16 copies of them).
  int64_t attn_out = 0;    // The attention output (FP8 copy, or its bf16 copy too).
  int64_t statistics = 0;  // The softmax statistics (log-sum-exp per row and head).
  // Everything but a caller-held input: what the block itself allocated.
  int64_t Own() const { return (input_owned ? input : 0) + normed + qkv + attn_out + statistics; }
  bool input_owned = false;
};

class SelfAttentionBlock {
 public:
  SelfAttentionBlock(const LayerContext& ctx, const std::string& name, int64_t dim, int64_t heads,
                     const attention::AttentionOptions& options);

  // With the bf16 flow (JaggedAttention::Bf16Flow) y is bf16, whatever x's
  // dtype: the residual stream between blocks is bf16 (the norm, the
  // projections and the residual add read and write bf16; the norm's
  // statistics and the add are computed in fp32). Otherwise y has x's dtype.
  absl::Status Forward(const JaggedView& x, Tensor* y);
  // dx = dy + the gradient through the attention branch; dx may alias dy.
  // dy and dx are of the model's dtype (the gradient stream stays fp32).
  absl::Status Backward(const TensorView& dy, const TensorView& dx);

  // Activation checkpointing of the block (BlockCheckpoint): Forward keeps
  // only what `mode` keeps, and Backward first recomputes the rest (its
  // FLOPs go to FlopCounter::recomputed) and then runs the usual backward,
  // so the gradients are those of kNone exactly. Without `fp8_saved` the
  // block keeps a view of its input x, which must stay unchanged until
  // Backward. With `fp8_saved` (any mode but kNone, whose norm backward
  // reads the input as it is) the block keeps its own FP8 copy of x (E4M3,
  // 1 x 128 blocks with an fp32 scale each, kernels/quant), so the caller
  // may free x after Forward, and the attention output, when the mode keeps
  // it, in FP8 as well; the backward recomputes from and reads their
  // dequantized values, so the gradients are approximate (those of the
  // branch at an input rounded to FP8; o's weight gradient and the
  // attention backward from an output rounded to FP8). A recomputing
  // block's tensors are dropped on every device (not only returned to a
  // pool), so a backward that read a stored activation instead of its
  // recomputation would fail. The projections' own bf16 copies of their
  // inputs (bf16 recipe without the bf16 flow) are still kept.
  void set_checkpoint(BlockCheckpoint mode, bool fp8_saved) {
    mode_ = mode;
    fp8_saved_ = fp8_saved && mode != BlockCheckpoint::kNone;
  }
  BlockCheckpoint checkpoint() const { return mode_; }
  bool fp8_saved() const { return fp8_saved_; }
  // Whole-block recomputation (kBlock) or none: the older switch.
  void set_recompute(bool on) { set_checkpoint(on ? BlockCheckpoint::kBlock : BlockCheckpoint::kNone, false); }
  bool recompute() const { return mode_ != BlockCheckpoint::kNone; }
  // Recomputes what the mode dropped, once after each Forward (Backward
  // calls it itself; a caller timing the recomputation calls it first). A
  // no-op for kNone.
  absl::Status Recompute();
  // The activations the block holds now, by kind: after Forward, what it
  // keeps for the backward (not the projections' own bf16 copies of their
  // inputs).
  BlockSavedBytes Saved() const;
  // Saved().Own(): the bytes the block itself holds.
  int64_t SavedBytes() const { return Saved().Own(); }

 private:
  // norm -> q, k, v -> attention -> o: fills normed_ ... proj_ from x.
  absl::Status ForwardBranch(const JaggedView& x);
  // The attention output back from its FP8 copy (a no-op without one).
  absl::Status RestoreOutput();

  LayerContext ctx_;
  int64_t dim_, heads_;
  RmsNorm norm_;
  Linear q_, k_, v_, o_;
  JaggedAttention attention_;
  Shape shape_;
  bool bf16_flow_ = false;
  BlockCheckpoint mode_ = BlockCheckpoint::kNone;
  bool fp8_saved_ = false;
  bool recomputed_ = false;  // Since the last Forward.
  JaggedView x_;  // The last forward's input (empty values with fp8_saved).
  DType x_dtype_ = DType::kFloat32;
  // Activations of the last forward (released after the backward on CUDA).
  Tensor normed_, q_out_, k_out_, v_out_, attn_out_, proj_;
  // fp8_saved: the input and the attention output in FP8 with their
  // scales, and the input dequantized for the recomputation.
  Tensor x8_, x8_scales_, a8_, a8_scales_, x_restored_;
  // Backward scratch.
  Tensor d_attn_, dq_, dk_, dv_, d_normed_, d_branch_;
};

class CrossAttention {
 public:
  // `forward_precision`, `backward_precision`: the attention forward's and
  // backward's (kFp8E4M3: the FP8 kernels, head dim 128).
  CrossAttention(const LayerContext& ctx, const std::string& name, int64_t dim, int64_t heads,
                 attention::ForwardPrecision forward_precision = attention::ForwardPrecision::kBf16,
                 attention::BackwardPrecision backward_precision = attention::BackwardPrecision::kBf16);

  // tokens [T, dim] and history [L, dim] share the batch size; every token
  // of sample b sees all of b's history (softmax, no positions). With the
  // bf16 flow the history may be bf16 and q, k, v, the attention and their
  // gradients are bf16; y (like tokens) is of the model's dtype.
  absl::Status Forward(const JaggedView& tokens, const JaggedView& history, Tensor* y);
  // dtokens (overwritten) = dy + the gradient through Q; dhistory
  // [L, dim] gets the gradient through K and V *added*.
  absl::Status Backward(const TensorView& dy, const TensorView& dtokens,
                        const TensorView& dhistory);

 private:
  LayerContext ctx_;
  int64_t dim_;
  Linear q_, k_, v_, o_;
  JaggedAttention attention_;
  bool bf16_flow_ = false;
  Tensor q_out_, k_out_, v_out_, attn_out_, proj_;
  Tensor d_attn_, dq_, dk_, dv_;
};

class Pma {
 public:
  // Registers `name`.queries [queries, dim] (N(0, 1)) and the projections.
  // `forward_precision` and `backward_precision` as CrossAttention's.
  Pma(const LayerContext& ctx, const std::string& name, int64_t dim, int64_t heads,
      int64_t queries,
      attention::ForwardPrecision forward_precision = attention::ForwardPrecision::kBf16,
      attention::BackwardPrecision backward_precision = attention::BackwardPrecision::kBf16);

  // With the bf16 flow as CrossAttention's; y is of the model's dtype.
  absl::Status Forward(const JaggedView& history, Tensor* y);
  // dhistory [L, dim] gets the gradient through K and V *added*.
  absl::Status Backward(const TensorView& dy, const TensorView& dhistory);

  int64_t queries() const { return num_queries_; }

 private:
  LayerContext ctx_;
  int64_t dim_, num_queries_;
  RegisteredParameter queries_;
  Linear k_, v_, o_;
  JaggedAttention attention_;
  bool bf16_flow_ = false;
  Tensor query_offsets_;
  // q_: the repeated queries (bf16 with the flow, from q32_).
  Tensor q32_, q_, k_out_, v_out_, attn_out_;
  Tensor d_attn_, dq_, dk_, dv_, dq32_;
};

// Offsets [batch + 1] of `per_sample` rows per sample: 0, n, 2n, ...
absl::Status UniformOffsets(int64_t batch, int64_t per_sample, Tensor* offsets);

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_ATTENTION_H_
