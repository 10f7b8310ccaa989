#ifndef RECFLEET_KERNELS_ATTENTION_CUDA_FP32_H_
#define RECFLEET_KERNELS_ATTENTION_CUDA_FP32_H_

// The fp32 CUDA attention (no tensor cores): exact-mode kernels for a
// training engine that runs in fp32 and must match the CPU reference to
// fp32 rounding. One thread block per (query row, head); scores are
// recomputed instead of stored; the backward adds dK/dV with fp32 atomics.
// Plain interface (no absl); device pointers; launches on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::attention::fp32_cuda {

struct Params {
  const int64_t* q_offsets = nullptr;  // device [batch + 1]
  const int64_t* k_offsets = nullptr;  // device [batch + 1]
  int batch = 0;
  int64_t total_q = 0, total_k = 0;
  int heads = 0, head_dim = 0;
  int activation = 0;  // 0 softmax, 1 gelu, 2 silu
  int mask = 0;        // 0 none, 1 causal, 2 window, 3 block
  int64_t window = 0, block = 64;
  float scale = 1.0f;
};

// q/k rows after QK-norm and RoPE (either may be off) into qt/kt.
struct TransformArgs {
  bool qk_norm = false, rope = false;
  float log2_theta = 0.0f, eps = 1e-6f;
};

// out [total_q, H, d]; lse [total_q, H] (softmax only, else null).
cudaError_t Forward(const Params& p, const float* q, const float* k, const float* v, float* out,
                    float* lse, void* stream);
// dq overwritten; dk, dv overwritten (zeroed here, then accumulated).
cudaError_t Backward(const Params& p, const float* q, const float* k, const float* v,
                     const float* out, const float* lse, const float* d_out, float* dq, float* dk,
                     float* dv, void* stream);

// y = rope(qknorm(x)) over rows [rows, H, d]; is_query picks the position
// rule (pq_i = i + Lk - Lq for queries, j for keys).
cudaError_t Transform(const Params& p, const TransformArgs& t, bool is_query, const float* x,
                      float* y, void* stream);
// dx from dy (the gradient of Transform's output) and x.
cudaError_t TransformBackward(const Params& p, const TransformArgs& t, bool is_query,
                              const float* x, const float* dy, float* dx, void* stream);

}  // namespace recfleet::attention::fp32_cuda

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_FP32_H_
