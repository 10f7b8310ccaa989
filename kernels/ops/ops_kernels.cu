// Elementwise CUDA kernels of the kernel API's activation, loss and Adam(W):
// grid-stride loops, fp32 arithmetic, one read and one write per element.

#include "kernels/base/cuda_util.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet::ops_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 4 ? 65535 * 4 : b));
}

__device__ __forceinline__ float Sigmoid(float x) {
  return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

__device__ __forceinline__ float Act(int act, float v) {
  switch (act) {
    case 0: return v > 0 ? v : 0.0f;
    case 1: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    default: return v * Sigmoid(v);
  }
}

__device__ __forceinline__ float ActGrad(int act, float v) {
  switch (act) {
    case 0: return v > 0 ? 1.0f : 0.0f;
    case 1:
      return 0.5f * (1.0f + erff(v * 0.70710678118654752f)) +
             v * 0.39894228040143267794f * expf(-0.5f * v * v);
    default: {
      const float s = Sigmoid(v);
      return s * (1.0f + v * (1.0f - s));
    }
  }
}

__global__ void ActForwardKernel(int act, const void* x, void* y, ElemType t, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    StoreF(y, t, i, Act(act, LoadF(x, t, i)));
  }
}

__global__ void ActBackwardKernel(int act, const void* x, const void* dy, void* dx, ElemType t,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    StoreF(dx, t, i, LoadF(dy, t, i) * ActGrad(act, LoadF(x, t, i)));
  }
}

__global__ void BceForwardKernel(const float* z, const float* y, float* loss, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const float v = z[i];
    loss[i] = fmaxf(v, 0.0f) - v * y[i] + log1pf(expf(-fabsf(v)));
  }
}

__global__ void BceBackwardKernel(const float* z, const float* y, const float* dloss, float* dz,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    dz[i] = dloss[i] * (Sigmoid(z[i]) - y[i]);
  }
}

// One element of an Adam(W) step: the single place of its arithmetic, so the
// per-tensor and the multi-tensor kernels agree bit for bit.
// `scale`: *s.grad_scale, read once per thread (GradScale). Returns the new
// value it stored.
__device__ __forceinline__ float AdamElement(const AdamScalars& s, float scale, float* p,
                                            const float* g, float* m, float* v, int64_t i) {
  float grad = g[i] * scale, param = p[i];
  if (s.decoupled) {
    param *= s.decay;
  } else {
    grad += s.weight_decay * param;
  }
  const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * grad;
  const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * grad * grad;
  m[i] = mi;
  v[i] = vi;
  const float updated = param - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_bc2 + s.eps);
  p[i] = updated;
  return updated;
}

// Multiplying by 1 is exact: without a scale the step is unchanged bit for bit.
__device__ __forceinline__ float GradScale(const AdamScalars& s) {
  return s.grad_scale != nullptr ? *s.grad_scale : 1.0f;
}

__global__ void AdamKernel(AdamScalars s, float* p, const float* g, float* m, float* v,
                           int64_t n) {
  const float scale = GradScale(s);
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    AdamElement(s, scale, p, g, m, v, i);
  }
}

enum class MultiOp { kAdam, kAdamBf16, kZeroGrad, kBf16Copy };

// Block b: chunk b of the table; its entry by binary search (a few dozen
// entries, cached), then a block-stride loop over the chunk's elements.
template <MultiOp kOp>
__global__ void MultiTensorKernel(AdamScalars s, const MultiTensorEntry* __restrict__ table,
                                  int count) {
  const int64_t chunk = blockIdx.x;
  const MultiTensorEntry e = table[FindChunkOwner(table, count, chunk)];
  const int64_t begin = (chunk - e.first_chunk) * kMultiTensorChunk;
  const int64_t end = min(begin + kMultiTensorChunk, e.numel);
  if (kOp == MultiOp::kBf16Copy && e.bf16 == nullptr) return;
  constexpr bool kStep = kOp == MultiOp::kAdam || kOp == MultiOp::kAdamBf16;
  const float scale = kStep ? GradScale(s) : 1.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    if constexpr (kOp == MultiOp::kAdam) {
      AdamElement(s, scale, e.param, e.grad, e.m, e.v, i);
    } else if constexpr (kOp == MultiOp::kAdamBf16) {
      // The new value rounded as the copy pass rounds it, without reading
      // param again.
      const float updated = AdamElement(s, scale, e.param, e.grad, e.m, e.v, i);
      if (e.bf16 != nullptr) {
        const __nv_bfloat16 b = __float2bfloat16_rn(updated);
        e.bf16[i] = *reinterpret_cast<const uint16_t*>(&b);
      }
    } else if constexpr (kOp == MultiOp::kZeroGrad) {
      e.grad[i] = 0.0f;
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(e.param[i]);
      e.bf16[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
  }
}

// The sum of `v` over the block, in thread 0, in a fixed order (warp
// shuffles, then the warps' sums in order): the same bits every run.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  }
  return total;
}

// Block b: the sum of grad^2 over chunk b of the table.
__global__ void GradSquaredSumKernel(const MultiTensorEntry* __restrict__ table, int count,
                                     float* partials) {
  const int64_t chunk = blockIdx.x;
  const MultiTensorEntry e = table[FindChunkOwner(table, count, chunk)];
  const int64_t begin = (chunk - e.first_chunk) * kMultiTensorChunk;
  const int64_t end = min(begin + kMultiTensorChunk, e.numel);
  float acc = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) acc = fmaf(e.grad[i], e.grad[i], acc);
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partials[chunk] = acc;
}

// One block: *sum (+)= the partials' total, added in fp64.
__global__ void SumPartialsKernel(const float* partials, int64_t n, float* sum, bool accumulate) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  acc = BlockSum(acc);
  if (threadIdx.x == 0) *sum = static_cast<float>((accumulate ? *sum : 0.0) + acc);
}

__global__ void GradClipScaleKernel(const float* sum, int64_t parts, double max_norm, float* scale) {
  double total = 0.0;
  for (int64_t i = 0; i < parts; ++i) total += sum[i];
  const double ratio = max_norm / (sqrt(total) + 1e-6);
  // fmin would drop a NaN ratio; clip_grad_norm_'s clamp keeps it.
  *scale = static_cast<float>(isnan(ratio) || ratio < 1.0 ? ratio : 1.0);
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

cudaError_t ActivationForward(int act, const void* x, void* y, int type, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ActForwardKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(act, x, y,
                                                              static_cast<ElemType>(type), n);
  return cudaGetLastError();
}

cudaError_t ActivationBackward(int act, const void* x, const void* dy, void* dx, int type,
                               int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ActBackwardKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(act, x, dy, dx,
                                                               static_cast<ElemType>(type), n);
  return cudaGetLastError();
}

cudaError_t BceForward(const float* z, const float* y, float* loss, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  BceForwardKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(z, y, loss, n);
  return cudaGetLastError();
}

cudaError_t BceBackward(const float* z, const float* y, const float* dloss, float* dz, int64_t n,
                        void* stream) {
  if (n == 0) return cudaSuccess;
  BceBackwardKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(z, y, dloss, dz, n);
  return cudaGetLastError();
}

cudaError_t AdamStep(const AdamScalars& s, float* p, const float* g, float* m, float* v,
                     int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  AdamKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(s, p, g, m, v, n);
  return cudaGetLastError();
}

namespace {

template <MultiOp kOp>
cudaError_t LaunchMulti(const AdamScalars& s, const MultiTensorEntry* table, int count,
                        int64_t chunks, void* stream) {
  if (chunks == 0) return cudaSuccess;
  if (chunks > 0x7fffffff) return cudaErrorInvalidValue;
  MultiTensorKernel<kOp><<<static_cast<unsigned>(chunks), kThreads, 0, Stream(stream)>>>(s, table,
                                                                                        count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t MultiTensorAdamStep(const AdamScalars& s, const MultiTensorEntry* table, int count,
                                int64_t chunks, void* stream) {
  return LaunchMulti<MultiOp::kAdam>(s, table, count, chunks, stream);
}

cudaError_t MultiTensorAdamStepBf16(const AdamScalars& s, const MultiTensorEntry* table, int count,
                                    int64_t chunks, void* stream) {
  return LaunchMulti<MultiOp::kAdamBf16>(s, table, count, chunks, stream);
}

cudaError_t MultiTensorZeroGrad(const MultiTensorEntry* table, int count, int64_t chunks,
                                void* stream) {
  return LaunchMulti<MultiOp::kZeroGrad>(AdamScalars{}, table, count, chunks, stream);
}

cudaError_t MultiTensorBf16Copy(const MultiTensorEntry* table, int count, int64_t chunks,
                                void* stream) {
  return LaunchMulti<MultiOp::kBf16Copy>(AdamScalars{}, table, count, chunks, stream);
}

cudaError_t MultiTensorGradSquaredSum(const MultiTensorEntry* table, int count, int64_t chunks,
                                      float* partials, float* sum, bool accumulate, void* stream) {
  if (chunks > 0x7fffffff) return cudaErrorInvalidValue;
  if (chunks > 0) {
    GradSquaredSumKernel<<<static_cast<unsigned>(chunks), kThreads, 0, Stream(stream)>>>(table, count,
                                                                                       partials);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  SumPartialsKernel<<<1, kThreads, 0, Stream(stream)>>>(partials, chunks, sum, accumulate);
  return cudaGetLastError();
}

cudaError_t GradClipScale(const float* sum, int64_t parts, double max_norm, float* scale,
                          void* stream) {
  GradClipScaleKernel<<<1, 1, 0, Stream(stream)>>>(sum, parts, max_norm, scale);
  return cudaGetLastError();
}

}  // namespace recfleet::ops_cuda
