#include "engine/layers/attention.h"

#include <utility>

#include "engine/layers/ops.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {
namespace {

// Cross-attention and PMA: softmax over the whole history, no positions.
attention::AttentionOptions PoolingOptions() { return attention::AttentionOptions(); }

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
  return ctx_.bf16_attention && (head_dim == 64 || head_dim == 128);
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

absl::Status JaggedAttention::Backward(const TensorView& d_out, const TensorView& dq,
                                       const TensorView& dk, const TensorView& dv) {
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
    return attention::AttentionBackward(in, options_, Reshaped(out_, {rows, heads_, dh}), lse,
                                        Reshaped(d_out, {rows, heads_, dh}), g);
  }
  RECFLEET_RETURN_IF_ERROR(ToBf16(ctx_, Reshaped(d_out, {rows, heads_, dh}), &do16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dq.shape, &dq16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dk.shape, &dk16_));
  RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, g.dv.shape, &dv16_));
  in.q.values = q16_.view();
  in.k.values = k16_.view();
  in.v = v16_.view();
  attention::AttentionGrads g16;
  g16.dq = dq16_.view();
  g16.dk = dk16_.view();
  g16.dv = dv16_.view();
  RECFLEET_RETURN_IF_ERROR(
      attention::AttentionBackward(in, options_, out16_.view(), lse, do16_.view(), g16));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dq16_.view(), g.dq));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dk16_.view(), g.dk));
  RECFLEET_RETURN_IF_ERROR(ops::Convert(dv16_.view(), g.dv));
  // Back to the pool for the next layer's backward (stream-ordered).
  for (Tensor* t : {&q16_, &k16_, &v16_, &out16_, &do16_, &dq16_, &dk16_, &dv16_}) *t = Tensor();
  return absl::OkStatus();
}

// ---- SelfAttentionBlock ------------------------------------------------------

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

bool SelfAttentionBlock::Bf16Flow(const TensorView& x) const {
  return x.device == Device::kCuda && attention_.Bf16(dim_ / heads_) && ctx_.AllBf16Linears();
}

absl::Status SelfAttentionBlock::Forward(const JaggedView& x, Tensor* y) {
  shape_ = x.values.shape;
  bf16_flow_ = Bf16Flow(x.values);
  RECFLEET_RETURN_IF_ERROR(norm_.Forward(x.values, &normed_));
  TensorView qkv_in = normed_.view();
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  if (bf16_flow_) {
    // One bf16 copy of the normed input for the three projections (which
    // round it to bf16 anyway); the fp32 one is not needed again.
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, DType::kBFloat16, normed_.shape(), &normed16_));
    RECFLEET_RETURN_IF_ERROR(ops::Convert(normed_.view(), normed16_.view()));
    normed_ = Tensor();
    qkv_in = normed16_.view();
  }
  RECFLEET_RETURN_IF_ERROR(q_.Forward(qkv_in, &q_out_, inner));
  RECFLEET_RETURN_IF_ERROR(k_.Forward(qkv_in, &k_out_, inner));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(qkv_in, &v_out_, inner));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_out_.view(), x.offsets},
                                              {k_out_.view(), x.offsets}, v_out_.view(),
                                              &attn_out_));
  RECFLEET_RETURN_IF_ERROR(o_.Forward(attn_out_.view(), &proj_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, x.values.shape, y));
  return ops::Add(x.values, proj_.view(), y->view());
}

absl::Status SelfAttentionBlock::Backward(const TensorView& dy, const TensorView& dx) {
  // With the bf16 flow the gradients between o, the attention and q/k/v
  // are bf16 too (each consumer would round them to bf16 itself).
  const DType inner = bf16_flow_ ? DType::kBFloat16 : ctx_.dtype;
  for (Tensor* t : {&d_attn_, &dq_, &dk_, &dv_}) {
    RECFLEET_RETURN_IF_ERROR(AllocateTyped(ctx_, inner, shape_, t));
  }
  for (Tensor* t : {&d_normed_, &d_branch_}) {
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, shape_, t));
  }
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view()));
  RECFLEET_RETURN_IF_ERROR(q_.Backward(dq_.view(), d_normed_.view(), false));
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), d_normed_.view(), true));
  RECFLEET_RETURN_IF_ERROR(v_.Backward(dv_.view(), d_normed_.view(), true));
  RECFLEET_RETURN_IF_ERROR(norm_.Backward(d_normed_.view(), d_branch_.view()));
  RECFLEET_RETURN_IF_ERROR(ops::Add(dy, d_branch_.view(), dx));
  // This block's activations and scratch are dead until its next forward:
  // back to the pool (stream-ordered) so the blocks below reuse the memory.
  if (dy.device == Device::kCuda) {
    for (Tensor* t : {&normed_, &normed16_, &q_out_, &k_out_, &v_out_, &attn_out_, &proj_,
                      &d_attn_, &dq_, &dk_, &dv_, &d_normed_, &d_branch_}) {
      *t = Tensor();
    }
  }
  return absl::OkStatus();
}

// ---- CrossAttention ----------------------------------------------------------

CrossAttention::CrossAttention(const LayerContext& ctx, const std::string& name, int64_t dim,
                               int64_t heads)
    : ctx_(ctx),
      dim_(dim),
      q_(ctx, name + ".q", dim, dim, false),
      k_(ctx, name + ".k", dim, dim, false),
      v_(ctx, name + ".v", dim, dim, false),
      o_(ctx, name + ".o", dim, dim, true),
      attention_(ctx, heads, PoolingOptions()) {}

absl::Status CrossAttention::Forward(const JaggedView& tokens, const JaggedView& history,
                                     Tensor* y) {
  RECFLEET_RETURN_IF_ERROR(q_.Forward(tokens.values, &q_out_));
  RECFLEET_RETURN_IF_ERROR(k_.Forward(history.values, &k_out_));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(history.values, &v_out_));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_out_.view(), tokens.offsets},
                                              {k_out_.view(), history.offsets}, v_out_.view(),
                                              &attn_out_));
  RECFLEET_RETURN_IF_ERROR(o_.Forward(attn_out_.view(), &proj_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, tokens.values.shape, y));
  return ops::Add(tokens.values, proj_.view(), y->view());
}

absl::Status CrossAttention::Backward(const TensorView& dy, const TensorView& dtokens,
                                      const TensorView& dhistory) {
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, q_out_.shape(), &d_attn_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, q_out_.shape(), &dq_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, k_out_.shape(), &dk_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, v_out_.shape(), &dv_));
  RECFLEET_RETURN_IF_ERROR(ops::Copy(dy, dtokens));  // The residual path.
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view()));
  RECFLEET_RETURN_IF_ERROR(q_.Backward(dq_.view(), dtokens, true));
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), dhistory, true));
  return v_.Backward(dv_.view(), dhistory, true);
}

// ---- Pma -------------------------------------------------------------------------

Pma::Pma(const LayerContext& ctx, const std::string& name, int64_t dim, int64_t heads,
         int64_t queries)
    : ctx_(ctx),
      dim_(dim),
      num_queries_(queries),
      queries_(ctx.parameters, name + ".queries", {queries, dim}, ParameterInit{1.0, 0.0}),
      k_(ctx, name + ".k", dim, dim, false),
      v_(ctx, name + ".v", dim, dim, false),
      o_(ctx, name + ".o", dim, dim, true),
      attention_(ctx, heads, PoolingOptions()) {}

absl::Status Pma::Forward(const JaggedView& history, Tensor* y) {
  const int64_t batch = history.batch_size(), rows = batch * num_queries_;
  RECFLEET_RETURN_IF_ERROR(UniformOffsets(batch, num_queries_, &query_offsets_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {rows, dim_}, &q_));
  RECFLEET_RETURN_IF_ERROR(ops::RepeatRows(queries_->value.view(), batch, q_.view()));
  RECFLEET_RETURN_IF_ERROR(k_.Forward(history.values, &k_out_));
  RECFLEET_RETURN_IF_ERROR(v_.Forward(history.values, &v_out_));
  RECFLEET_RETURN_IF_ERROR(attention_.Forward({q_.view(), query_offsets_.view()},
                                              {k_out_.view(), history.offsets}, v_out_.view(),
                                              &attn_out_));
  return o_.Forward(attn_out_.view(), y);
}

absl::Status Pma::Backward(const TensorView& dy, const TensorView& dhistory) {
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, q_.shape(), &d_attn_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, q_.shape(), &dq_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, k_out_.shape(), &dk_));
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, v_out_.shape(), &dv_));
  RECFLEET_RETURN_IF_ERROR(o_.Backward(dy, d_attn_.view(), false));
  RECFLEET_RETURN_IF_ERROR(attention_.Backward(d_attn_.view(), dq_.view(), dk_.view(), dv_.view()));
  RECFLEET_RETURN_IF_ERROR(ops::AccumulateRepeats(dq_.view(), queries_->grad.view()));
  RECFLEET_RETURN_IF_ERROR(k_.Backward(dk_.view(), dhistory, true));
  return v_.Backward(dv_.view(), dhistory, true);
}

}  // namespace recfleet::engine::layers
