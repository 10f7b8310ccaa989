#include "kernels/attention/attention.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_internal.h"

namespace recfleet::attention {
namespace {

absl::Status CheckValues(const TensorView& t, absl::string_view what, const TensorView& q) {
  if (auto s = CheckRank(t, what, 3); !s.ok()) return s;
  if (auto s = CheckDim(t, what, 1, q.dim(1)); !s.ok()) return s;
  if (auto s = CheckDim(t, what, 2, q.dim(2)); !s.ok()) return s;
  if (auto s = CheckDType(t, what, {q.dtype}); !s.ok()) return s;
  return CheckDevice(t, what, q.device);
}

// A view the caller must either leave empty or fill with the given shape.
absl::Status CheckShaped(const TensorView& t, absl::string_view what, const Shape& shape,
                         std::initializer_list<DType> dtypes, Device device) {
  if (t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must not be empty"));
  }
  if (auto s = CheckDType(t, what, dtypes); !s.ok()) return s;
  if (auto s = CheckDevice(t, what, device); !s.ok()) return s;
  if (t.shape != shape) {
    TensorView want = t;
    want.shape = shape;
    return absl::InvalidArgumentError(absl::StrCat(what, " must be ", want.DebugString(),
                                                   ", got ", t.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckLse(const TensorView& lse, const AttentionInputs& in,
                      const AttentionOptions& opts) {
  const TensorView& q = in.q.values;
  if (opts.activation != Activation::kSoftmax) {
    if (lse.data != nullptr) {
      return absl::InvalidArgumentError(
          "lse must be empty (data == nullptr) unless the activation is softmax");
    }
    return absl::OkStatus();
  }
  const bool cpu = q.device == Device::kCpu;
  return CheckShaped(lse, "lse", Shape{q.dim(0), q.dim(1)},
                     cpu ? std::initializer_list<DType>{DType::kFloat32, DType::kFloat64}
                         : std::initializer_list<DType>{DType::kFloat32},
                     q.device);
}

}  // namespace

int64_t BiasLength(const JaggedView& q, const JaggedView& k, int64_t heads) {
  int64_t n = 0;
  for (int64_t b = 0; b < q.batch_size(); ++b) n += q.length(b) * k.length(b);
  return n * heads;
}

absl::Status ValidateAttention(const AttentionInputs& in, const AttentionOptions& opts) {
  const TensorView& q = in.q.values;
  if (auto s = CheckRank(q, "q.values", 3); !s.ok()) return s;
  if (auto s = CheckJagged(in.q, "q"); !s.ok()) return s;
  if (auto s = CheckJagged(in.k, "k"); !s.ok()) return s;
  if (auto s = CheckValues(in.k.values, "k.values", q); !s.ok()) return s;
  if (auto s = CheckValues(in.v, "v", q); !s.ok()) return s;
  if (auto s = CheckDim(in.v, "v", 0, in.k.values.dim(0)); !s.ok()) return s;
  if (in.q.batch_size() != in.k.batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q.offsets and k.offsets must describe the same batch size, got ", in.q.batch_size(),
        " and ", in.k.batch_size()));
  }
  if (q.dim(1) < 1 || q.dim(2) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("q.values must have heads >= 1 and head_dim >= 1, got ", q.DebugString()));
  }
  if (q.device == Device::kCpu) {
    if (auto s = CheckDType(q, "q.values", {DType::kFloat64, DType::kFloat32, DType::kBFloat16});
        !s.ok()) {
      return s;
    }
  } else if (q.dtype == DType::kFloat32) {
    if (q.dim(2) > 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the fp32 CUDA attention supports head_dim <= 256, got ", q.DebugString()));
    }
    if (in.bias.data != nullptr) {
      return absl::InvalidArgumentError(
          "the fp32 CUDA attention takes no bias (use bf16 tensors for biased attention)");
    }
  } else {
    if (auto s = CheckDType(q, "q.values", {DType::kBFloat16, DType::kFloat32}); !s.ok()) return s;
    if (q.dim(2) != 64 && q.dim(2) != 128) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA attention supports head_dim 64 or 128, got ", q.DebugString()));
    }
  }
  if (opts.mask == Mask::kSlidingWindow && opts.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.window must be >= 1 for a sliding window, got ", opts.window));
  }
  if (opts.rope && q.dim(2) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoPE needs an even head_dim, got ", q.DebugString()));
  }
  const bool fp8_fwd = opts.forward_precision == ForwardPrecision::kFp8E4M3;
  const bool fp8_bwd = opts.backward_precision == BackwardPrecision::kFp8E4M3;
  if (fp8_fwd || fp8_bwd) {
    if (q.device != Device::kCuda || q.dtype != DType::kBFloat16 || q.dim(2) != 128 ||
        opts.activation != Activation::kSoftmax || in.bias.data != nullptr ||
        opts.scale < 0.0 || opts.mask == Mask::kBlock) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.", fp8_fwd ? "forward" : "backward",
          "_precision = kFp8E4M3 needs CUDA bf16 tensors with head_dim 128, the softmax "
          "activation, no bias, a positive (or default) scale and a mask "
          "other than kBlock; got q.values ",
          q.DebugString()));
    }
  }
  if (in.bias.data != nullptr) {
    const int64_t n = BiasLength(in.q, in.k, q.dim(1));
    if (auto s = CheckShaped(in.bias, "bias", Shape{n}, {q.dtype}, q.device); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status AttentionForward(const AttentionInputs& in, const AttentionOptions& opts,
                              TensorView out, TensorView lse) {
  if (auto s = ValidateAttention(in, opts); !s.ok()) return s;
  const TensorView& q = in.q.values;
  if (auto s = CheckShaped(out, "out", q.shape, {q.dtype}, q.device); !s.ok()) return s;
  if (auto s = CheckLse(lse, in, opts); !s.ok()) return s;
  if (q.device == Device::kCpu) return internal::ForwardCpu(in, opts, out, lse);
  if (q.dtype == DType::kFloat32) return internal::ForwardCudaFp32(in, opts, out, lse);
  return internal::ForwardCuda(in, opts, out, lse);
}

absl::Status AttentionBackward(const AttentionInputs& in, const AttentionOptions& opts,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& d_out, const AttentionGrads& grads) {
  if (auto s = ValidateAttention(in, opts); !s.ok()) return s;
  const TensorView& q = in.q.values;
  if (auto s = CheckShaped(out, "out", q.shape, {q.dtype}, q.device); !s.ok()) return s;
  if (auto s = CheckLse(lse, in, opts); !s.ok()) return s;
  if (auto s = CheckShaped(d_out, "d_out", q.shape, {q.dtype}, q.device); !s.ok()) return s;
  if (auto s = CheckShaped(grads.dq, "dq", q.shape, {q.dtype}, q.device); !s.ok()) return s;
  if (auto s = CheckShaped(grads.dk, "dk", in.k.values.shape, {q.dtype}, q.device); !s.ok()) {
    return s;
  }
  if (auto s = CheckShaped(grads.dv, "dv", in.v.shape, {q.dtype}, q.device); !s.ok()) return s;
  if (grads.dbias.data != nullptr) {
    if (in.bias.data == nullptr) {
      return absl::InvalidArgumentError("dbias must be empty when no bias is given");
    }
    if (auto s = CheckShaped(grads.dbias, "dbias", in.bias.shape, {q.dtype}, q.device);
        !s.ok()) {
      return s;
    }
  }
  if (q.device == Device::kCpu) return internal::BackwardCpu(in, opts, d_out, grads);
  if (q.dtype == DType::kFloat32) {
    if (grads.dbias.data != nullptr) {
      return absl::InvalidArgumentError("the fp32 CUDA attention computes no dbias");
    }
    return internal::BackwardCudaFp32(in, opts, out, lse, d_out, grads);
  }
  return internal::BackwardCuda(in, opts, out, lse, d_out, grads);
}

double AttentionForwardFlops(const JaggedView& q, const JaggedView& k, int64_t heads,
                             int64_t head_dim, const AttentionOptions& opts) {
  double pairs = 0;
  for (int64_t b = 0; b < q.batch_size(); ++b) {
    pairs += static_cast<double>(internal::VisiblePairs(opts, q.length(b), k.length(b)));
  }
  return pairs * 4.0 * static_cast<double>(head_dim) * static_cast<double>(heads);
}

}  // namespace recfleet::attention
