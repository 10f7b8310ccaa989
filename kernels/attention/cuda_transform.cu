// Row-wise passes around the jagged kernels: QK-norm and RoPE of q/k (and
// their chain rule in the backward), and rowsum(dO * O) for the softmax
// backward. One warp per (row, head); lane l holds columns l + 32 e, so both
// halves of every RoPE pair (c, c + d/2) sit in the same lane.

#include <algorithm>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Position of a row: pq_i = i + Lk - Lq for queries, j for keys.
__device__ __forceinline__ int Position(const TransformParams& p, int64_t row) {
  // The sequence b with own[b] <= row < own[b + 1] (never an empty one).
  int lo = 0, hi = p.batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.own_offsets[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int i = static_cast<int>(row - p.own_offsets[lo]);
  if (!p.is_query) return i;
  const int64_t lq = p.own_offsets[lo + 1] - p.own_offsets[lo];
  const int64_t lk = p.peer_offsets[lo + 1] - p.peer_offsets[lo];
  return static_cast<int>(i + lk - lq);
}

// Rotates a lane's RoPE pairs (v[e], v[e + E/2]) = columns (c, c + D/2), c =
// lane + 32 e, by the angle of `pos`, or by its negative (the transpose).
template <int D>
__device__ __forceinline__ void Rotate(float (&v)[D / 32], int pos, bool inverse,
                                       const TransformParams& p) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < E / 2; ++e) {
    float cs, sn;
    RopeCosSin(pos, lane + 32 * e, D, p.log2_theta, cs, sn);
    if (inverse) sn = -sn;
    const float a = v[e], b = v[e + E / 2];
    v[e] = a * cs - b * sn;
    v[e + E / 2] = b * cs + a * sn;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) QkTransformKernel(const TransformParams p) {
  constexpr int E = D / 32;
  const int64_t rh = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (rh >= p.rows * p.heads) return;
  const int lane = threadIdx.x & 31;
  const bf16* x = static_cast<const bf16*>(p.x) + rh * D;
  float v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = __bfloat162float(x[lane + 32 * e]);
  if (p.qk_norm) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss += v[e] * v[e];
    const float r = rsqrtf(WarpSum(ss) + 1e-6f);
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] *= r;
  }
  if (p.rope) Rotate<D>(v, Position(p, rh / p.heads), /*inverse=*/false, p);
  bf16* y = static_cast<bf16*>(p.y) + rh * D;
#pragma unroll
  for (int e = 0; e < E; ++e) y[lane + 32 * e] = __float2bfloat16(v[e]);
}

template <int D>
__global__ void __launch_bounds__(kThreads) QkTransformBackwardKernel(const TransformParams p) {
  constexpr int E = D / 32;
  const int64_t rh = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (rh >= p.rows * p.heads) return;
  const int lane = threadIdx.x & 31;
  const bf16* dy = static_cast<const bf16*>(p.dy) + rh * D;
  float gr[E];
#pragma unroll
  for (int e = 0; e < E; ++e) gr[e] = __bfloat162float(dy[lane + 32 * e]);
  if (p.rope) Rotate<D>(gr, Position(p, rh / p.heads), /*inverse=*/true, p);
  if (p.qk_norm) {
    // y = x r with r = (|x|^2 + eps)^-1/2: dx = r (g - y <y, g>).
    const bf16* x = static_cast<const bf16*>(p.x) + rh * D;
    float v[E], ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      v[e] = __bfloat162float(x[lane + 32 * e]);
      ss += v[e] * v[e];
    }
    const float r = rsqrtf(WarpSum(ss) + 1e-6f);
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      v[e] *= r;
      dot += v[e] * gr[e];
    }
    dot = WarpSum(dot);
#pragma unroll
    for (int e = 0; e < E; ++e) gr[e] = r * (gr[e] - v[e] * dot);
  }
  bf16* dx = static_cast<bf16*>(p.y) + rh * D;
#pragma unroll
  for (int e = 0; e < E; ++e) dx[lane + 32 * e] = __float2bfloat16(gr[e]);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    RowDotKernel(const bf16* dout, const bf16* out, float* dsum, int64_t n) {
  constexpr int E = D / 32;
  const int64_t rh = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (rh >= n) return;
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    acc += __bfloat162float(dout[rh * D + lane + 32 * e]) *
           __bfloat162float(out[rh * D + lane + 32 * e]);
  }
  acc = WarpSum(acc);
  if (lane == 0) dsum[rh] = acc;
}

__global__ void FloatToBf16Kernel(const float* x, bf16* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16(x[i]);
  }
}

int Blocks(int64_t rows_heads) {
  return static_cast<int>((rows_heads + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

int LaunchQkTransform(const TransformParams& p, void* stream) {
  const int blocks = Blocks(p.rows * p.heads);
  if (blocks == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 64) {
    QkTransformKernel<64><<<blocks, kThreads, 0, s>>>(p);
  } else {
    QkTransformKernel<128><<<blocks, kThreads, 0, s>>>(p);
  }
  return cudaGetLastError();
}

int LaunchQkTransformBackward(const TransformParams& p, void* stream) {
  const int blocks = Blocks(p.rows * p.heads);
  if (blocks == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 64) {
    QkTransformBackwardKernel<64><<<blocks, kThreads, 0, s>>>(p);
  } else {
    QkTransformBackwardKernel<128><<<blocks, kThreads, 0, s>>>(p);
  }
  return cudaGetLastError();
}

int LaunchFloatToBf16(const float* x, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 16));
  FloatToBf16Kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, static_cast<bf16*>(y),
                                                                            n);
  return cudaGetLastError();
}

int LaunchRowDot(const void* dout, const void* out, float* dsum, int64_t rows, int heads,
                 int head_dim, void* stream) {
  const int blocks = Blocks(rows * heads);
  if (blocks == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const bf16* a = static_cast<const bf16*>(dout);
  const bf16* b = static_cast<const bf16*>(out);
  if (head_dim == 64) {
    RowDotKernel<64><<<blocks, kThreads, 0, s>>>(a, b, dsum, rows * heads);
  } else {
    RowDotKernel<128><<<blocks, kThreads, 0, s>>>(a, b, dsum, rows * heads);
  }
  return cudaGetLastError();
}

}  // namespace recfleet::attention::cuda_impl
