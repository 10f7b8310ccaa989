// A C ABI over the attention API so that Python (ctypes + PyTorch tensors)
// can call the kernels on the same device buffers as the PyTorch baselines.
// Device pointers come from torch tensors; offsets are host int64 arrays.

#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/attention/attention.h"

extern "C" {

// Mirrors the ctypes structure in bench_attention.py field by field.
struct RfAttentionArgs {
  void* q;  // bf16 [total_q, heads, head_dim] on the GPU
  void* k;  // bf16 [total_k, heads, head_dim]
  void* v;
  void* bias;  // bf16 [heads * sum Lq*Lk] or null
  const int64_t* q_offsets;  // host, [batch + 1]
  const int64_t* k_offsets;  // host, [batch + 1]
  int64_t batch;
  int64_t heads;
  int64_t head_dim;
  int32_t activation;  // 0 softmax, 1 gelu, 2 silu
  int32_t mask;        // 0 none, 1 causal, 2 sliding window, 3 block
  int64_t window;
  double scale;  // 0: 1/sqrt(head_dim)
  int32_t qk_norm;
  int32_t rope;
  double rope_theta;
  void* out;  // bf16 like q
  void* lse;  // fp32 [total_q, heads] (softmax) or null
  void* dout;
  void* dq;
  void* dk;
  void* dv;
  void* dbias;   // or null
  void* stream;  // cudaStream_t
};

}  // extern "C"

namespace {

using recfleet::DType;
using recfleet::Device;
using recfleet::MakeView;
using recfleet::TensorView;
namespace attn = recfleet::attention;

struct Converted {
  attn::AttentionInputs in;
  attn::AttentionOptions opts;
  TensorView out, lse, dout;
  attn::AttentionGrads grads;
};

Converted Convert(const RfAttentionArgs& a) {
  Converted c;
  const int64_t tq = a.q_offsets[a.batch], tk = a.k_offsets[a.batch];
  auto dev = [&](void* p, int64_t rows) {
    return p == nullptr ? TensorView()
                        : MakeView(p, DType::kBFloat16, {rows, a.heads, a.head_dim},
                                   Device::kCuda);
  };
  c.in.q.values = dev(a.q, tq);
  c.in.q.offsets = MakeView(const_cast<int64_t*>(a.q_offsets), DType::kInt64, {a.batch + 1});
  c.in.k.values = dev(a.k, tk);
  c.in.k.offsets = MakeView(const_cast<int64_t*>(a.k_offsets), DType::kInt64, {a.batch + 1});
  c.in.v = dev(a.v, tk);
  const int64_t nbias = attn::BiasLength(c.in.q, c.in.k, a.heads);
  if (a.bias != nullptr) c.in.bias = MakeView(a.bias, DType::kBFloat16, {nbias}, Device::kCuda);
  c.opts.activation = static_cast<attn::Activation>(a.activation);
  c.opts.mask = static_cast<attn::Mask>(a.mask);
  c.opts.window = a.window;
  c.opts.scale = a.scale;
  c.opts.qk_norm = a.qk_norm != 0;
  c.opts.rope = a.rope != 0;
  c.opts.rope_theta = a.rope_theta;
  c.opts.cuda_stream = a.stream;
  c.out = dev(a.out, tq);
  if (a.lse != nullptr) c.lse = MakeView(a.lse, DType::kFloat32, {tq, a.heads}, Device::kCuda);
  c.dout = dev(a.dout, tq);
  c.grads.dq = dev(a.dq, tq);
  c.grads.dk = dev(a.dk, tk);
  c.grads.dv = dev(a.dv, tk);
  if (a.dbias != nullptr) {
    c.grads.dbias = MakeView(a.dbias, DType::kBFloat16, {nbias}, Device::kCuda);
  }
  return c;
}

int Report(const absl::Status& s, char* err, int err_len) {
  if (s.ok()) return 0;
  if (err != nullptr && err_len > 0) {
    const std::string m = s.ToString();
    std::strncpy(err, m.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" {

// Each returns 0 on success, else 1 with the status text in err.
int rf_attention_forward(const RfAttentionArgs* a, char* err, int err_len) {
  Converted c = Convert(*a);
  return Report(attn::AttentionForward(c.in, c.opts, c.out, c.lse), err, err_len);
}

// The same forward with FP8 (e4m3) operands (AttentionOptions::
// forward_precision), quantize pre-pass included.
int rf_attention_forward_fp8(const RfAttentionArgs* a, char* err, int err_len) {
  Converted c = Convert(*a);
  c.opts.forward_precision = attn::ForwardPrecision::kFp8E4M3;
  return Report(attn::AttentionForward(c.in, c.opts, c.out, c.lse), err, err_len);
}

int rf_attention_backward(const RfAttentionArgs* a, char* err, int err_len) {
  Converted c = Convert(*a);
  return Report(attn::AttentionBackward(c.in, c.opts, c.out, c.lse, c.dout, c.grads), err,
                err_len);
}

// The backward with FP8 (e4m3) operands (AttentionOptions::
// backward_precision), quantize pre-pass included. The
// backward reads the forward's out and lse, whichever forward made them.
int rf_attention_backward_fp8(const RfAttentionArgs* a, char* err, int err_len) {
  Converted c = Convert(*a);
  c.opts.backward_precision = attn::BackwardPrecision::kFp8E4M3;
  return Report(attn::AttentionBackward(c.in, c.opts, c.out, c.lse, c.dout, c.grads), err,
                err_len);
}

// Useful forward FLOPs of the call (from the real lengths and the mask).
double rf_attention_forward_flops(const RfAttentionArgs* a) {
  Converted c = Convert(*a);
  return attn::AttentionForwardFlops(c.in.q, c.in.k, a->heads, a->head_dim, c.opts);
}

}  // extern "C"
