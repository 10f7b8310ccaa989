// Launcher of the fp32 CUDA attention (cuda_fp32.h): offsets to the device,
// QK-norm / RoPE passes into temporaries, the kernels, and the chain rule of
// the passes in the backward. Temporaries are stream-ordered.

#include <cmath>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/cuda_fp32.h"
#include "kernels/base/cuda_status.h"

namespace recfleet::attention::internal {
namespace {

using fp32_cuda::Params;
using fp32_cuda::TransformArgs;

#define RECFLEET_ATTENTION_CUDA_CHECK(expr, what)                   \
  do {                                                              \
    if (absl::Status s_ = CudaStatus((expr), what); !s_.ok()) return s_; \
  } while (0)

cudaStream_t S(const AttentionOptions& o) { return static_cast<cudaStream_t>(o.cuda_stream); }

// Stream-ordered device temporaries, freed on the stream when it goes.
class Temps {
 public:
  explicit Temps(cudaStream_t s) : stream_(s) {}
  ~Temps() {
    for (void* p : ptrs_) cudaFreeAsync(p, stream_);
  }
  absl::StatusOr<void*> Get(size_t bytes) {
    void* p = nullptr;
    if (absl::Status s = CudaStatus(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, stream_),
                                    "attention fp32 temporary");
        !s.ok()) {
      return s;
    }
    ptrs_.push_back(p);
    return p;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> ptrs_;
};

// Offsets (host) -> device copies, and the launch parameters.
absl::StatusOr<Params> MakeParams(const AttentionInputs& in, const AttentionOptions& o,
                                  Temps& temps) {
  Params p;
  p.batch = static_cast<int>(in.q.batch_size());
  p.total_q = in.q.values.dim(0);
  p.total_k = in.k.values.dim(0);
  p.heads = static_cast<int>(in.q.values.dim(1));
  p.head_dim = static_cast<int>(in.q.values.dim(2));
  p.activation = static_cast<int>(o.activation);
  p.mask = static_cast<int>(o.mask);
  p.window = o.window;
  p.block = kAttentionBlockSize;
  p.scale = static_cast<float>(ResolvedScale(o, p.head_dim));
  const size_t bytes = (p.batch + 1) * sizeof(int64_t);
  std::vector<int64_t> host(2 * (p.batch + 1));
  for (int b = 0; b <= p.batch; ++b) {
    host[b] = in.q.offset(b);
    host[p.batch + 1 + b] = in.k.offset(b);
  }
  absl::StatusOr<void*> dev = temps.Get(2 * bytes);
  if (!dev.ok()) return dev.status();
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(*dev, host.data(), 2 * bytes,
                                                  cudaMemcpyHostToDevice, S(o)),
                                  "attention offsets");
      !s.ok()) {
    return s;
  }
  p.q_offsets = static_cast<const int64_t*>(*dev);
  p.k_offsets = p.q_offsets + p.batch + 1;
  return p;
}

TransformArgs MakeTransform(const AttentionOptions& o) {
  TransformArgs t;
  t.qk_norm = o.qk_norm;
  t.rope = o.rope;
  t.log2_theta = static_cast<float>(std::log2(o.rope_theta));
  t.eps = static_cast<float>(kQkNormEpsilon);
  return t;
}

// q and k after the row passes: the inputs themselves when there are none.
absl::Status Transformed(const Params& p, const AttentionInputs& in, const AttentionOptions& o,
                         Temps& temps, const float** q, const float** k) {
  *q = in.q.values.as<const float>();
  *k = in.k.values.as<const float>();
  if (!o.qk_norm && !o.rope) return absl::OkStatus();
  const TransformArgs t = MakeTransform(o);
  absl::StatusOr<void*> qt = temps.Get(in.q.values.nbytes());
  if (!qt.ok()) return qt.status();
  absl::StatusOr<void*> kt = temps.Get(in.k.values.nbytes());
  if (!kt.ok()) return kt.status();
  RECFLEET_ATTENTION_CUDA_CHECK(
      fp32_cuda::Transform(p, t, true, *q, static_cast<float*>(*qt), o.cuda_stream), "q transform");
  RECFLEET_ATTENTION_CUDA_CHECK(
      fp32_cuda::Transform(p, t, false, *k, static_cast<float*>(*kt), o.cuda_stream), "k transform");
  *q = static_cast<const float*>(*qt);
  *k = static_cast<const float*>(*kt);
  return absl::OkStatus();
}

}  // namespace

absl::Status ForwardCudaFp32(const AttentionInputs& in, const AttentionOptions& opts,
                             TensorView out, TensorView lse) {
  Temps temps(S(opts));
  absl::StatusOr<Params> p = MakeParams(in, opts, temps);
  if (!p.ok()) return p.status();
  const float *q, *k;
  if (absl::Status s = Transformed(*p, in, opts, temps, &q, &k); !s.ok()) return s;
  return CudaStatus(fp32_cuda::Forward(*p, q, k, in.v.as<const float>(), out.as<float>(),
                                       lse.data == nullptr ? nullptr : lse.as<float>(),
                                       opts.cuda_stream),
                    "attention fp32 forward");
}

absl::Status BackwardCudaFp32(const AttentionInputs& in, const AttentionOptions& opts,
                              const TensorView& out, const TensorView& lse,
                              const TensorView& d_out, const AttentionGrads& grads) {
  Temps temps(S(opts));
  absl::StatusOr<Params> p = MakeParams(in, opts, temps);
  if (!p.ok()) return p.status();
  const float *q, *k;
  if (absl::Status s = Transformed(*p, in, opts, temps, &q, &k); !s.ok()) return s;
  const bool passes = opts.qk_norm || opts.rope;
  float* dq = grads.dq.as<float>();
  float* dk = grads.dk.as<float>();
  if (passes) {  // Gradients of the transformed q/k first.
    absl::StatusOr<void*> t = temps.Get(grads.dq.nbytes());
    if (!t.ok()) return t.status();
    dq = static_cast<float*>(*t);
    t = temps.Get(grads.dk.nbytes());
    if (!t.ok()) return t.status();
    dk = static_cast<float*>(*t);
  }
  RECFLEET_ATTENTION_CUDA_CHECK(
      fp32_cuda::Backward(*p, q, k, in.v.as<const float>(), out.as<const float>(),
                          lse.data == nullptr ? nullptr : lse.as<const float>(),
                          d_out.as<const float>(), dq, dk, grads.dv.as<float>(), opts.cuda_stream),
      "attention fp32 backward");
  if (!passes) return absl::OkStatus();
  const TransformArgs t = MakeTransform(opts);
  RECFLEET_ATTENTION_CUDA_CHECK(
      fp32_cuda::TransformBackward(*p, t, true, in.q.values.as<const float>(), dq,
                                   grads.dq.as<float>(), opts.cuda_stream),
      "q transform backward");
  return CudaStatus(fp32_cuda::TransformBackward(*p, t, false, in.k.values.as<const float>(), dk,
                                                 grads.dk.as<float>(), opts.cuda_stream),
                    "k transform backward");
}

}  // namespace recfleet::attention::internal
