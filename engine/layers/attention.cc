#include "engine/layers/attention.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "engine/layers/ops.h"
#include "common/status_macros.h"
#include "kernels/quant/quantize.h"

namespace recfleet::engine::layers {
namespace {

// Cross-attention and PMA: softmax over the whole history, no positions.
attention::AttentionOptions PoolingOptions(attention::ForwardPrecision forward_precision,
                                           attention::BackwardPrecision backward_precision) {
  attention::AttentionOptions o;
  o.forward_precision = forward_precision;
  o.backward_precision = backward_precision;
  return o;
}

}  // namespace

absl::Status UniformOffsets(int64_t batch, int64_t per_sample, Tensor* offsets) {
  if (offsets->empty() || offsets->dtype() != DType::kInt64 || offsets->numel() != batch + 1) {
    absl::StatusOr<Tensor> t = Tensor::Empty(DType::kInt64, {batch + 1});
    if (!t.ok()) return t.status();
    *offsets = *std::move(t);
  }
  int64_t* o = offsets->data<int64_t>();
  for (int64_t b = 0; b <= batch; ++b) o[b] = b * per_sample;
  return absl::OkStatus();
}

// ---- JaggedAttention ---------------------------------------------------------

JaggedAttention::JaggedAttention(const LayerContext& ctx, int64_t heads,
                                 const attention::AttentionOptions& options)
    : ctx_(ctx), heads_(heads), options_(options) {}

bool JaggedAttention::Bf16(int64_t head_dim) const {
  return (ctx_.bf16_attention || Fp8()) && (head_dim == 64 || head_dim == 128);
}

bool JaggedAttention::Fp8() const {
  return options_.forward_precision == attention::ForwardPrecision::kFp8E4M3;
}

attention::AttentionOptions JaggedAttention::BackwardOptions() const {
  attention::AttentionOptions o = options_;
  o.forward_precision = attention::ForwardPrecision::kBf16;
  return o;
}

bool JaggedAttention::Bf16Flow(const TensorView& x, int64_t dim) const {
  return x.device == Device::kCuda && Bf16(dim / heads_) && ctx_.AllBf16Linears();
}

attention::AttentionInputs JaggedAttention::Inputs() const {
  const int64_t dim = q_.values.dim(1), dh = dim / heads_;
  attention::AttentionInputs in;
  in.q.values = Reshaped(q_.values, {q_.values.dim(0), heads_, dh});
  in.q.offsets = q_.offsets;
  in.k.values = Reshaped(k_.values, {k_.values.dim(0), heads_, dh});
  in.k.offsets = k_.offsets;
  in.v = Reshaped(v_, {v_.dim(0), heads_, dh});
  return in;
}

namespace {

// A bf16 copy of the fp32 tensor behind `x` with x's shape.
absl::Status ToBf16(const LayerContext& ctx, const TensorView& x, Tensor* copy) {
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx, DType::kBFloat16, x.shape, copy));
  return ops::Convert(x, copy->view());
}

}  // namespace

absl::Status JaggedAttention::Forward(const JaggedView& q, const JaggedView& k,
                                      const TensorView& v, Tensor* out) {
  const ScopedPhase phase(ctx_.phases, Phase::kAttention);
  q_ = q;
  k_ = k;
  v_ = v;
  const int64_t rows = q.values.dim(0), dim = q.values.dim(1), dh = dim / heads_;
  if (Fp8() && (q.values.device != Device::kCuda || dh != 128)) {
    return absl::InvalidArgumentError(
        absl::StrCat("JaggedAttention: the FP8 attention forward needs CUDA tensors with head dim 128; got q ",
                     q.values.DebugString(), " with ", heads_, " heads"));
  }
  // bf16 q, k, v (from bf16-output projections) go to the bf16 kernels as
  // they are, and the output stays bf16.
  const bool bf16_in = q.values.dtype == DType::kBFloat16;
  if (bf16_in && (!Bf16(dh) || k.values.dtype != DType::kBFloat16 || v.dtype != DType::kBFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JaggedAttention: bf16 q, k and v need the bf16 kernels (bf16 attention, head dim 64 or "
        "128); got q ", q.values.DebugString(), ", k ", k.values.DebugString(), ", v ",
        v.DebugString()));
  }
  RECFLEET_RETURN_IF_ERROR(
      AllocateTyped(ctx_, bf16_in ? DType::kBFloat16 : ctx_.dtype, {rows, dim}, out));
  out_ = out->view();
  if (rows == 0) return absl::OkStatus();
  attention::AttentionInputs in = Inputs();
  TensorView lse;
  if (options_.activation == attention::Activation::kSoftmax) {
    // fp32 except for an fp64 (CPU) model.
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(
        ctx_, ctx_.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32, {rows, heads_},
        &lse_));
    lse = lse_.view();
  }
  if (ctx_.flops != nullptr) {
    ctx_.flops->attention += attention::AttentionForwardFlops(in.q, in.k, heads_, dh, options_);
  }
  if (!Bf16(dh) || bf16_in) {
    return attention::AttentionForward(in, options_, Reshaped(out_, {rows, heads_, dh}), lse);
  }
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, in.q.values, &q16_));
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, in.k.values, &k16_));
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, in.v, &v16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, in.q.values.shape, &out16_));
  in.q.values = q16_.view();
  in.k.values = k16_.view();
  in.v = v16_.view();
  RECFLEET_RETURN_IF_ERROR(attention::AttentionForward(in, options_, out16_.view(), lse));
  return ops::Convert(out16_.view(), out_);
}

void JaggedAttention::ReleaseSaved() {
  for (Tensor* t : {&lse_, &q16_, &k16_, &v16_, &out16_}) *t = Tensor();
}

void JaggedAttention::ReleaseInputCopies() {
  for (Tensor* t : {&q16_, &k16_, &v16_}) *t = Tensor();
}

absl::Status JaggedAttention::RebindInputs(const JaggedView& q, const JaggedView& k,
                                           const TensorView& v) {
  q_ = q;
  k_ = k;
  v_ = v;
  const int64_t rows = q.values.dim(0), dh = q.values.dim(1) / heads_;
  if (rows == 0 || !Bf16(dh) || q.values.dtype == DType::kBFloat16) return absl::OkStatus();
  const attention::AttentionInputs in = Inputs();
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, in.q.values, &q16_));
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, in.k.values, &k16_));
  return ToBf16(ctx_, in.v, &v16_);
}

int64_t JaggedAttention::SavedBytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&lse_, &q16_, &k16_, &v16_, &out16_}) {
    if (!t->empty()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

int64_t JaggedAttention::StatisticsBytes() const {
  return lse_.empty() ? 0 : static_cast<int64_t>(lse_.nbytes());
}

absl::Status JaggedAttention::Backward(const TensorView& d_out, const TensorView& dq,
                                       const TensorView& dk, const TensorView& dv,
                                       bool qk_writable) {
  const ScopedPhase phase(ctx_.phases, Phase::kAttention);
  const int64_t rows = q_.values.dim(0), dim = q_.values.dim(1), dh = dim / heads_;
  if (rows == 0) {
    // No query saw a key: the keys and values get no gradient.
    RECFLEET_RETURN_IF_ERROR(ops::Zero(dk));
    return ops::Zero(dv);
  }
  attention::AttentionInputs in = Inputs();
  attention::AttentionGrads g;
  g.dq = Reshaped(dq, in.q.values.shape);
  g.dk = Reshaped(dk, in.k.values.shape);
  g.dv = Reshaped(dv, in.v.shape);
  const TensorView lse =
      options_.activation == attention::Activation::kSoftmax ? lse_.view() : TensorView();
  if (!Bf16(dh) || q_.values.dtype == DType::kBFloat16) {
    // fp32 throughout, or bf16 throughout (d_out and the gradients in the
    // dtypes of out and q, k, v).
    in.qk_writable = qk_writable;
    return attention::AttentionBackward(in, BackwardOptions(), Reshaped(out_, {rows, heads_, dh}), lse,
                                        Reshaped(d_out, {rows, heads_, dh}), g);
  }
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, Reshaped(d_out, {rows, heads_, dh}), &do16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dq.shape, &dq16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dk.shape, &dk16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dv.shape, &dv16_));
  in.q.values = q16_.view();
  in.k.values = k16_.view();
  in.v = v16_.view();
  in.qk_writable = true;  // Its own copies, released below.
  attention::AttentionGrads g16;
  g16.dq = dq16_.view();
  g16.dk = dk16_.view();
  g16.dv = dv16_.view();
  RECFLEET_RETURN_IF_ERROR(
      attention::AttentionBackward(in, BackwardOptions(), out16_.view(), lse, do16_.view(), g16));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dq16_.view(), g.dq));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dk16_.view(), g.dk));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dv16_.view(), g.dv));
  // Back to the pool for the next layer's backward (stream-ordered).
  for (Tensor* t : {&q16_, &k16_, &v16_, &out16_, &do16_, &dq16_, &dk16_, &dv16_}) *t = Tensor();
  return absl::OkStatus();
}

// ---- SelfAttentionBlock ------------------------------------------------------

namespace {

// Step-sized tensors a layer no longer needs: back to the pool
// (stream-ordered, so kernels already enqueued still read them) for the
// layers that run next. The host engine keeps them for reuse.
void Release(Device device, std::initializer_list<Tensor*> tensors) {
  if (device != Device::kCuda) return;
  for (Tensor* t : tensors) *t = Tensor();
}

}  // namespace

SelfAttentionBlock::SelfAttentionBlock(const LayerContext& ctx, const std::string& name,
                                       int64_t dim, int64_t heads,
                                       const attention::AttentionOptions& options)
    : ctx_(ctx),
      dim_(dim),
      heads_(heads),
      norm_(ctx, name + ".norm", dim),
      q_(ctx, name + ".q", dim, dim, false),
      k_(ctx, name + ".k", dim, dim, false),
      v_(ctx, name + ".v", dim, dim, false),
      o_(ctx, name + ".o", dim, dim, true),
      attention_(ctx, heads, options) {}

absl::string_view BlockCheckpointName(BlockCheckpoint mode) {
  switch (mode) {
    case BlockCheckpoint::kNone:
      return "none";
    case BlockCheckpoint::kNorm:
      return "norm";
    case BlockCheckpoint::kProjections:
      return "projections";
    case BlockCheckpoint::kBlock:
      return "block";
  }
  return "unknown";
}

absl::StatusOr<BlockCheckpoint> ParseBlockCheckpoint(absl::string_view name) {
  for (BlockCheckpoint m : {BlockCheckpoint::kNone, BlockCheckpoint::kNorm,
                            BlockCheckpoint::kProjections, BlockCheckpoint::kBlock}) {
    if (name == BlockCheckpointName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown attention block checkpoint \"", name, "\": none, norm, projections or block"));
}

namespace {

// The FP8 copy of activations a block keeps (kernels/quant's 1 x 128
// blocks, E4M3, round to nearest): q and its fp32 scales.
absl::Status QuantizeSaved(const LayerContext& ctx, const TensorView& x, Tensor* q,
                           Tensor* scales) {
  const int64_t rows = x.dim(0), cols = x.numel() / std::max<int64_t>(rows, 1);
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx, DType::kFloat8E4M3, {rows, cols}, q));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx, DType::kFloat32,
                                         QuantScaleShape(rows, cols, ScaleBlock::k1x128), scales));
  if (rows == 0) return absl::OkStatus();
  return Quantize(Reshaped(x, {rows, cols}), QuantizeConfig(), /*transpose=*/false, q->view(),
                  scales->view());
}

// Its values back, in `dtype`.
absl::Status DequantizeSaved(const LayerContext& ctx, const Tensor& q, const Tensor& scales,
                             DType dtype, Tensor* x) {
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx, dtype, q.shape(), x));
  if (q.numel() == 0) return absl::OkStatus();
  return Dequantize(q.view(), scales.view(), ScaleBlock::k1x128, x->view());
}

int64_t Bytes(std::initializer_list<const Tensor*> tensors) {
  int64_t bytes = 0;
  for (const Tensor* t : tensors) {
    if (!t->empty()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

}  // namespace

absl::Status SelfAttentionBlock::ForwardBranch(const JaggedView& x) {
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  // With the flow the norm writes the bf16 operand of the three
  // projections directly.
  RECFLEET_RETURN_IF_ERROR(norm_.Forward(x.values, &normed_, inner));
  RECFLEET_RETURN_IF_ERROR(q_.Forward(normed_.view(), &q_out_, inner));
  RECFLEET_RETURN_IF_ERROR(k_.Forward(normed_.view(), &k_out_, inner));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(normed_.view(), &v_out_, inner));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_out_.view(), x.offsets},
                                              {k_out_.view(), x.offsets}, v_out_.view(),
                                              &attn_out_));
  return o_.Forward(attn_out_.view(), &proj_, inner);
}

absl::Status SelfAttentionBlock::Forward(const JaggedView& x, Tensor* y) {
  shape_ = x.values.shape;
  x_dtype_ = x.values.dtype;
  recomputed_ = false;
  bf16_flow_ = attention_.Bf16Flow(x.values, dim_);
  RECFLEET_RETURN_IF_ERROR(ForwardBranch(x));
  RECFLEET_RETURN_IF_ERROR(
      AllocateTyped(ctx_, bf16_flow_ ? DType::kBFloat16 : x.values.dtype, x.values.shape, y));
  RECFLEET_RETURN_IF_ERROR(ops::Add(x.values, proj_.view(), y->view()));
  // The backward needs o's input, not its output.
  Release(x.values.device, {&proj_});
  x_ = x;
  for (Tensor* t : {&x8_, &x8_scales_, &a8_, &a8_scales_, &x_restored_}) *t = Tensor();
  if (mode_ == BlockCheckpoint::kNone) return absl::OkStatus();
  // Dropped on every device (not only returned to a pool), so a backward
  // that read a stored activation instead of its recomputation would fail.
  proj_ = Tensor();
  normed_ = Tensor();
  if (mode_ >= BlockCheckpoint::kProjections) {
    for (Tensor* t : {&q_out_, &k_out_, &v_out_}) *t = Tensor();
    attention_.ReleaseInputCopies();
  }
  if (mode_ == BlockCheckpoint::kBlock) {
    attn_out_ = Tensor();
    attention_.ReleaseSaved();
  }
  if (fp8_saved_) {
    RECFLEET_RETURN_IF_ERROR(QuantizeSaved(ctx_, x.values, &x8_, &x8_scales_));
    x_.values = TensorView();
    if (!attn_out_.empty()) {
      RECFLEET_RETURN_IF_ERROR(QuantizeSaved(ctx_, attn_out_.view(), &a8_, &a8_scales_));
      attn_out_ = Tensor();
    }
  }
  return absl::OkStatus();
}

absl::Status SelfAttentionBlock::RestoreOutput() {
  if (a8_.empty()) return absl::OkStatus();
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  RECFLEET_RETURN_IF_ERROR(DequantizeSaved(ctx_, a8_, a8_scales_, inner, &attn_out_));
  a8_ = Tensor();
  a8_scales_ = Tensor();
  attention_.RebindOutput(attn_out_.view());
  o_.RebindInput(attn_out_.view());
  return absl::OkStatus();
}

absl::Status SelfAttentionBlock::Recompute() {
  if (mode_ == BlockCheckpoint::kNone || recomputed_) return absl::OkStatus();
  // The recomputation is extra work, not model FLOPs.
  FlopCounter* flops = ctx_.flops;
  const FlopCounter before = flops != nullptr ? *flops : FlopCounter();
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  JaggedView x = x_;
  if (fp8_saved_) {
    RECFLEET_RETURN_IF_ERROR(DequantizeSaved(ctx_, x8_, x8_scales_, x_dtype_, &x_restored_));
    x.values = Reshaped(x_restored_.view(), shape_);
    x8_ = Tensor();
    x8_scales_ = Tensor();
  }
  // Every mode but kNone recomputes the norm; its backward then reads x
  // (the restored input with fp8_saved) and the recomputed statistics.
  RECFLEET_RETURN_IF_ERROR(norm_.Forward(x.values, &normed_, inner));
  if (mode_ == BlockCheckpoint::kNorm) {
    for (Linear* l : {&q_, &k_, &v_}) l->RebindInput(normed_.view());
  } else {
    RECFLEET_RETURN_IF_ERROR(q_.Forward(normed_.view(), &q_out_, inner));
    RECFLEET_RETURN_IF_ERROR(k_.Forward(normed_.view(), &k_out_, inner));
    RECFLEET_RETURN_IF_ERROR(v_.Forward(normed_.view(), &v_out_, inner));
    const JaggedView q{q_out_.view(), x.offsets}, k{k_out_.view(), x.offsets};
    if (mode_ == BlockCheckpoint::kProjections) {
      RECFLEET_RETURN_IF_ERROR(attention_.RebindInputs(q, k, v_out_.view()));
    } else {
      // o's output is not needed, only its input: o's forward is not rerun.
      RECFLEET_RETURN_IF_ERROR(attention_.Forward(q, k, v_out_.view(), &attn_out_));
      o_.RebindInput(attn_out_.view());
    }
  }
  RECFLEET_RETURN_IF_ERROR(RestoreOutput());
  if (flops != nullptr) {
    flops->recomputed += (flops->linear - before.linear) + (flops->attention - before.attention);
    flops->linear = before.linear;
    flops->attention = before.attention;
  }
  recomputed_ = true;
  return absl::OkStatus();
}

BlockSavedBytes SelfAttentionBlock::Saved() const {
  BlockSavedBytes b;
  b.input_owned = !x8_.empty();
  b.input = b.input_owned ? Bytes({&x8_, &x8_scales_})
                          : (x_.values.data != nullptr ? static_cast<int64_t>(x_.values.nbytes()) : 0);
  b.normed = Bytes({&normed_});
  b.qkv = Bytes({&q_out_, &k_out_, &v_out_});
  b.attn_out = Bytes({&attn_out_, &a8_, &a8_scales_});
  // The attention's own: the statistics and, off the bf16 flow on the bf16
  // kernels, its bf16 copies of q, k, v and out (those count as q, k, v).
  const int64_t attention = attention_.SavedBytes();
  const int64_t stats = attention_.StatisticsBytes();
  b.statistics = stats;
  b.qkv += attention - stats;
  return b;
}

absl::Status SelfAttentionBlock::Backward(const TensorView& dy, const TensorView& dx) {
  // kNorm's recomputation (the norm's output, and with fp8_saved the input
  // it is made from) is read first by q, k and v's backward: it waits until
  // the attention's backward, where the block's memory peaks, is done.
  // Only the attention output (FP8-saved) is restored before o's backward.
  const bool defer_norm = mode_ == BlockCheckpoint::kNorm && !recomputed_;
  RECFLEET_RETURN_IF_ERROR(defer_norm ? RestoreOutput() : Recompute());
  // With the bf16 flow the gradients between o, the attention and q/k/v
  // are bf16 too (each consumer would round them to bf16 itself); the
  // gradient of the norm's output sums three GEMMs and stays fp32. Each
  // scratch tensor is allocated when first written and released (CUDA) as
  // soon as it is read for the last time, and so is each activation: the
  // block's backward holds at most its activations plus four [L, dim]
  // gradients at once.
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  const Device device = dy.device;
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, shape_, &d_attn_));
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  for (Tensor* t : {&dq_, &dk_, &dv_}) {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, shape_, t));
  }
  // q and k are read by nothing after the attention's backward (q, k and
  // v's backward read their input, the norm's output), so it may overwrite
  // them (AttentionInputs::qk_writable).
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view(),
                                               /*qk_writable=*/true));
  Release(device, {&d_attn_, &attn_out_});
  if (device == Device::kCuda) attention_.ReleaseSaved();
  if (defer_norm) RECFLEET_RETURN_IF_ERROR(Recompute());
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape_, &d_normed_));
  RECFLEET_RETURN_IF_ERROR(q_.Backward(dq_.view(), d_normed_.view(), false));
  Release(device, {&dq_, &q_out_});
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), d_normed_.view(), true));
  Release(device, {&dk_, &k_out_});
  RECFLEET_RETURN_IF_ERROR(v_.Backward(dv_.view(), d_normed_.view(), true));
  Release(device, {&dv_, &v_out_});
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape_, &d_branch_));
  RECFLEET_RETURN_IF_ERROR(norm_.Backward(d_normed_.view(), d_branch_.view()));
  Release(device, {&d_normed_, &normed_});
  RECFLEET_RETURN_IF_ERROR(ops::Add(dy, d_branch_.view(), dx));
  // This block's activations and scratch are dead until its next forward.
  Release(device, {&proj_, &d_branch_, &x_restored_});
  return absl::OkStatus();
}

// ---- CrossAttention ----------------------------------------------------------

CrossAttention::CrossAttention(const LayerContext& ctx, const std::string& name, int64_t dim,
                               int64_t heads, attention::ForwardPrecision forward_precision,
                               attention::BackwardPrecision backward_precision)
    : ctx_(ctx),
      dim_(dim),
      q_(ctx, name + ".q", dim, dim, false),
      k_(ctx, name + ".k", dim, dim, false),
      v_(ctx, name + ".v", dim, dim, false),
      o_(ctx, name + ".o", dim, dim, true),
      attention_(ctx, heads, PoolingOptions(forward_precision, backward_precision)) {}

absl::Status CrossAttention::Forward(const JaggedView& tokens, const JaggedView& history,
                                     Tensor* y) {
  bf16_flow_ = attention_.Bf16Flow(history.values, dim_);
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  RECFLEET_RETURN_IF_ERROR(q_.Forward(tokens.values, &q_out_, inner));
  RECFLEET_RETURN_IF_ERROR(k_.Forward(history.values, &k_out_, inner));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(history.values, &v_out_, inner));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_out_.view(), tokens.offsets},
                                              {k_out_.view(), history.offsets}, v_out_.view(),
                                              &attn_out_));
  RECFLEET_RETURN_IF_ERROR(o_.Forward(attn_out_.view(), &proj_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, tokens.values.shape, y));
  RECFLEET_RETURN_IF_ERROR(ops::Add(tokens.values, proj_.view(), y->view()));
  Release(tokens.values.device, {&proj_});
  return absl::OkStatus();
}

absl::Status CrossAttention::Backward(const TensorView& dy, const TensorView& dtokens,
                                      const TensorView& dhistory) {
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, q_out_.shape(), &d_attn_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, q_out_.shape(), &dq_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, k_out_.shape(), &dk_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, v_out_.shape(), &dv_));
  RECFLEET_RETURN_IF_ERROR(ops::Copy(dy, dtokens));  // The residual path.
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view()));
  RECFLEET_RETURN_IF_ERROR(q_.Backward(dq_.view(), dtokens, true));
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), dhistory, true));
  RECFLEET_RETURN_IF_ERROR(v_.Backward(dv_.view(), dhistory, true));
  Release(dy.device, {&q_out_, &k_out_, &v_out_, &attn_out_, &d_attn_, &dq_, &dk_, &dv_});
  return absl::OkStatus();
}

// ---- Pma -------------------------------------------------------------------------

Pma::Pma(const LayerContext& ctx, const std::string& name, int64_t dim, int64_t heads,
         int64_t queries, attention::ForwardPrecision forward_precision,
         attention::BackwardPrecision backward_precision)
    : ctx_(ctx),
      dim_(dim),
      num_queries_(queries),
      queries_(ctx.parameters, name + ".queries", {queries, dim}, ParameterInit{1.0, 0.0}),
      k_(ctx, name + ".k", dim, dim, false),
      v_(ctx, name + ".v", dim, dim, false),
      o_(ctx, name + ".o", dim, dim, true),
      attention_(ctx, heads, PoolingOptions(forward_precision, backward_precision)) {}

absl::Status Pma::Forward(const JaggedView& history, Tensor* y) {
  const int64_t batch = history.batch_size(), rows = batch * num_queries_;
  bf16_flow_ = attention_.Bf16Flow(history.values, dim_);
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  RECFLEET_RETURN_IF_ERROR(UniformOffsets(batch, num_queries_, &query_offsets_));
  Tensor* repeated = bf16_flow_ ? &q32_ : &q_;
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows, dim_}, repeated));
  RECFLEET_RETURN_IF_ERROR(ops::RepeatRows(queries_->value.view(), batch, repeated->view()));
  if (bf16_flow_) {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, {rows, dim_}, &q_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(q32_.view(), q_.view()));
    q32_ = Tensor();
  }
  RECFLEET_RETURN_IF_ERROR(k_.Forward(history.values, &k_out_, inner));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(history.values, &v_out_, inner));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_.view(), query_offsets_.view()},
                                              {k_out_.view(), history.offsets}, v_out_.view(),
                                              &attn_out_));
  return o_.Forward(attn_out_.view(), y);
}

absl::Status Pma::Backward(const TensorView& dy, const TensorView& dhistory) {
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, q_.shape(), &d_attn_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, q_.shape(), &dq_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, k_out_.shape(), &dk_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, v_out_.shape(), &dv_));
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view()));
  TensorView dq = dq_.view();
  if (bf16_flow_) {
    // The queries' gradient sums over the batch in fp32.
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, q_.shape(), &dq32_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(dq, dq32_.view()));
    dq = dq32_.view();
  }
  RECFLEET_RETURN_IF_ERROR(ops::AccumulateRepeats(dq, queries_->grad.view()));
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), dhistory, true));
  RECFLEET_RETURN_IF_ERROR(v_.Backward(dv_.view(), dhistory, true));
  Release(dy.device, {&q_, &k_out_, &v_out_, &attn_out_, &d_attn_, &dq_, &dk_, &dv_, &dq32_});
  return absl::OkStatus();
}

}  // namespace recfleet::engine::layers
