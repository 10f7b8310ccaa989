// CUDA versions of the engine's glue ops (ops.h): small, memory-bound
// kernels; each element is read and written once. Reductions run in a
// fixed order per output element, so results are deterministic.

#include <cuda_bf16.h>

#include <algorithm>

#include "engine/layers/ops_cuda.h"
#include "kernels/base/cuda_util.h"

namespace recfleet::engine::ops_cuda {
namespace {

constexpr int kThreads = 256;
// The largest output (elements) ScatterAddRows sums in shared memory: 48 KiB,
// the default dynamic shared-memory limit.
constexpr int64_t kFewRowsElems = 48 * 1024 / sizeof(float);

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

#define RECFLEET_GRID_LOOP(i, n)                                                     \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// out = f(a, b, c, w, out) for the op kinds of ops_cuda::Elementwise.
template <int K>
__device__ __forceinline__ float ElementwiseOp(float a, float b, float c, float w, float o) {
  switch (K) {
    case 0: return a + b;
    case 1: return a * b;
    case 2: return o + a * b;
    case 3: return a * b + c;
    case 4: return a * w;
    case 5: return o + w * a;
    default: return w;
  }
}

template <int K>
__device__ __forceinline__ void ElementwiseAt(const float* a, const float* b, const float* c,
                                              float w, float* out, int64_t i) {
  constexpr bool kA = K != 6, kB = K <= 3, kC = K == 3, kO = K == 2 || K == 5;
  out[i] = ElementwiseOp<K>(kA ? a[i] : 0.0f, kB ? b[i] : 0.0f, kC ? c[i] : 0.0f, w,
                            kO ? out[i] : 0.0f);
}

// One kernel per op kind (no switch per element), reading only the operands
// the kind uses. With kVec (every operand 16-byte aligned), four elements
// per float4 load, and the last n % 4 elements one by one. out may be a
// (Scale): each element is read before it is written by the same thread.
template <int K, bool kVec>
__global__ void ElementwiseKernel(const float* a, const float* b, const float* c, float w,
                                  float* out, int64_t n) {
  if (!kVec) {
    RECFLEET_GRID_LOOP(i, n) { ElementwiseAt<K>(a, b, c, w, out, i); }
    return;
  }
  constexpr bool kA = K != 6, kB = K <= 3, kC = K == 3, kO = K == 2 || K == 5;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  RECFLEET_GRID_LOOP(v, n / 4) {
    const float4 x = kA ? reinterpret_cast<const float4*>(a)[v] : zero;
    const float4 y = kB ? reinterpret_cast<const float4*>(b)[v] : zero;
    const float4 z = kC ? reinterpret_cast<const float4*>(c)[v] : zero;
    const float4 o = kO ? reinterpret_cast<const float4*>(out)[v] : zero;
    reinterpret_cast<float4*>(out)[v] =
        make_float4(ElementwiseOp<K>(x.x, y.x, z.x, w, o.x), ElementwiseOp<K>(x.y, y.y, z.y, w, o.y),
                    ElementwiseOp<K>(x.z, y.z, z.z, w, o.z), ElementwiseOp<K>(x.w, y.w, z.w, w, o.w));
  }
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < n % 4) ElementwiseAt<K>(a, b, c, w, out, n / 4 * 4 + t);
}

template <int K>
void LaunchElementwise(const float* a, const float* b, const float* c, float w, float* out,
                       int64_t n, cudaStream_t s) {
  auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (aligned(a) && aligned(b) && aligned(c) && aligned(out)) {  // null counts as aligned
    ElementwiseKernel<K, true><<<Blocks((n + 3) / 4), kThreads, 0, s>>>(a, b, c, w, out, n);
  } else {
    ElementwiseKernel<K, false><<<Blocks(n), kThreads, 0, s>>>(a, b, c, w, out, n);
  }
}

__global__ void RepeatKernel(const float* x, int64_t n, int64_t total, float* out) {
  RECFLEET_GRID_LOOP(i, total) { out[i] = x[i % n]; }
}

__global__ void AccumulateRepeatsKernel(const float* dy, int64_t n, int64_t times, float* dx) {
  RECFLEET_GRID_LOOP(i, n) {
    float s = dx[i];
    for (int64_t t = 0; t < times; ++t) s += dy[t * n + i];
    dx[i] = s;
  }
}

__global__ void SoftmaxKernel(const float* x, float* y, int64_t rows, int64_t cols) {
  RECFLEET_GRID_LOOP(r, rows) {
    const float* g = x + r * cols;
    float* p = y + r * cols;
    float mx = g[0];
    for (int64_t e = 1; e < cols; ++e) mx = fmaxf(mx, g[e]);
    float sum = 0;
    for (int64_t e = 0; e < cols; ++e) sum += p[e] = expf(g[e] - mx);
    for (int64_t e = 0; e < cols; ++e) p[e] /= sum;
  }
}

__global__ void SoftmaxBackwardKernel(const float* y, const float* dy, float* dx, int64_t rows,
                                      int64_t cols) {
  RECFLEET_GRID_LOOP(r, rows) {
    const float* p = y + r * cols;
    const float* g = dy + r * cols;
    float mean = 0;
    for (int64_t e = 0; e < cols; ++e) mean += p[e] * g[e];
    for (int64_t e = 0; e < cols; ++e) dx[r * cols + e] = p[e] * (g[e] - mean);
  }
}

__global__ void AddGatedKernel(const float* gate, int64_t experts, int64_t column, const float* x,
                               int64_t rows, int64_t n, float* acc) {
  RECFLEET_GRID_LOOP(i, rows * n) { acc[i] += gate[(i / n) * experts + column] * x[i]; }
}

// One warp per row: dx elementwise, the dot product reduced in the warp.
__global__ void AddGatedBackwardKernel(const float* gate, int64_t experts, int64_t column,
                                       const float* x, const float* dacc, int64_t rows, int64_t n,
                                       float* dx, float* dgate) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= rows) return;
  const float g = gate[warp * experts + column];
  float dot = 0;
  for (int64_t j = lane; j < n; j += 32) {
    const float d = dacc[warp * n + j];
    dx[warp * n + j] = g * d;
    dot += d * x[warp * n + j];
  }
  dot = cuda_util::WarpSum(dot);
  if (lane == 0) dgate[warp * experts + column] = dot;
}

__global__ void ScaleBagsKernel(const float* sums, const int64_t* offsets, int64_t bags,
                                int64_t dim, bool mean, float* out) {
  RECFLEET_GRID_LOOP(i, bags * dim) {
    const int64_t b = i / dim, len = offsets[b + 1] - offsets[b];
    out[i] = sums[i] * (mean && len > 0 ? 1.0f / static_cast<float>(len) : 1.0f);
  }
}

__global__ void ExpandBagsKernel(const float* dpooled, const int64_t* offsets, int64_t bags,
                                 int64_t ids, int64_t dim, bool mean, float* out) {
  RECFLEET_GRID_LOOP(i, ids * dim) {
    const int64_t row = i / dim, c = i % dim;
    // The bag b with offsets[b] <= row < offsets[b + 1] (never an empty one).
    int64_t lo = 0, hi = bags;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (offsets[mid] <= row) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int64_t len = offsets[lo + 1] - offsets[lo];
    out[i] = dpooled[lo * dim + c] * (mean ? 1.0f / static_cast<float>(len) : 1.0f);
  }
}

// dst[c] += src[c] for c < dim by one warp: each lane loads up to 8 of
// its columns before it adds any of them (8 loads in flight), and the adds
// are atomics (shared or global memory, wherever dst points).
__device__ __forceinline__ void WarpAddRow(const float* __restrict__ src, float* dst, int dim,
                                           int lane) {
  constexpr int kPer = 8;
  for (int c0 = lane; c0 < dim; c0 += 32 * kPer) {
    float v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = c0 + 32 * j;
      v[j] = c < dim ? src[c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = c0 + 32 * j;
      if (c < dim) atomicAdd(dst + c, v[j]);
    }
  }
}

// One warp per input row, its lanes over the columns: no division per
// element, one slot load per row.
__global__ void ScatterAddRowsKernel(const float* __restrict__ rows, const int64_t* slots,
                                     int64_t n, int dim, float* out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; r < n; r += warps) {
    WarpAddRow(rows + r * dim, out + slots[r] * dim, dim, lane);
  }
}

// For an output of few rows (a small table, or a batch whose ids repeat a
// lot): each block sums its share of the input rows into a shared-memory
// copy of the whole output, then adds that copy to out once. The global
// atomics per output element drop from one per input row to one per block.
__global__ void ScatterAddFewRowsKernel(const float* __restrict__ rows, const int64_t* slots,
                                        int64_t n, int dim, int out_elems, float* out) {
  extern __shared__ float acc[];
  for (int e = threadIdx.x; e < out_elems; e += blockDim.x) acc[e] = 0.0f;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; r < n; r += warps) {
    WarpAddRow(rows + r * dim, acc + static_cast<int>(slots[r]) * dim, dim, lane);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < out_elems; e += blockDim.x) {
    if (acc[e] != 0.0f) atomicAdd(out + e, acc[e]);
  }
}

__global__ void ToBf16Kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  RECFLEET_GRID_LOOP(i, n) { y[i] = __float2bfloat16_rn(x[i]); }
}

__global__ void FromBf16Kernel(const __nv_bfloat16* x, float* y, int64_t n) {
  RECFLEET_GRID_LOOP(i, n) { y[i] = __bfloat162float(x[i]); }
}

__device__ __forceinline__ float LoadMixed(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
              : static_cast<const float*>(p)[i];
}

__global__ void AddMixedKernel(const void* a, bool a16, const void* b, bool b16, void* out,
                               bool out16, int64_t n) {
  RECFLEET_GRID_LOOP(i, n) {
    const float s = LoadMixed(a, a16, i) + LoadMixed(b, b16, i);
    if (out16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(s);
    } else {
      static_cast<float*>(out)[i] = s;
    }
  }
}

}  // namespace

cudaError_t AddMixed(const void* a, bool a_bf16, const void* b, bool b_bf16, void* out,
                     bool out_bf16, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  AddMixedKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(a, a_bf16, b, b_bf16, out, out_bf16,
                                                             n);
  return cudaGetLastError();
}

cudaError_t ScatterAddRows(const float* rows, const int64_t* slots, int64_t n, int64_t dim,
                           int64_t out_rows, float* out, void* stream) {
  if (n * dim == 0) return cudaSuccess;
  if (dim > (int64_t{1} << 30)) return cudaErrorInvalidValue;
  constexpr int64_t kWarps = kThreads / 32;
  const int64_t out_elems = out_rows * dim;
  if (out_elems <= kFewRowsElems && n >= 4 * out_rows) {
    // Enough input rows per block (at least 4x the output's) that the
    // block's zeroing and flush stay small beside its share of the input.
    // At most 256 blocks (about two per SM): each output element takes one
    // global atomic per block.
    const int64_t per_block = std::max<int64_t>(kWarps * 8, 4 * out_rows);
    const int64_t blocks = std::min<int64_t>((n + per_block - 1) / per_block, 256);
    ScatterAddFewRowsKernel<<<static_cast<unsigned>(blocks), kThreads,
                              static_cast<size_t>(out_elems) * sizeof(float), Stream(stream)>>>(
        rows, slots, n, static_cast<int>(dim), static_cast<int>(out_elems), out);
  } else {
    ScatterAddRowsKernel<<<Blocks(n * 32), kThreads, 0, Stream(stream)>>>(
        rows, slots, n, static_cast<int>(dim), out);
  }
  return cudaGetLastError();
}

cudaError_t ToBf16(const float* x, void* y, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ToBf16Kernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(x, static_cast<__nv_bfloat16*>(y), n);
  return cudaGetLastError();
}

cudaError_t FromBf16(const void* x, float* y, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  FromBf16Kernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), y, n);
  return cudaGetLastError();
}

cudaError_t Elementwise(int kind, const float* a, const float* b, const float* c, float w,
                        float* out, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  cudaStream_t s = Stream(stream);
  switch (kind) {
    case 0: LaunchElementwise<0>(a, b, c, w, out, n, s); break;
    case 1: LaunchElementwise<1>(a, b, c, w, out, n, s); break;
    case 2: LaunchElementwise<2>(a, b, c, w, out, n, s); break;
    case 3: LaunchElementwise<3>(a, b, c, w, out, n, s); break;
    case 4: LaunchElementwise<4>(a, b, c, w, out, n, s); break;
    case 5: LaunchElementwise<5>(a, b, c, w, out, n, s); break;
    default: LaunchElementwise<6>(a, b, c, w, out, n, s); break;
  }
  return cudaGetLastError();
}

cudaError_t RepeatRows(const float* x, int64_t n, int64_t times, float* out, void* stream) {
  if (n * times == 0) return cudaSuccess;
  RepeatKernel<<<Blocks(n * times), kThreads, 0, Stream(stream)>>>(x, n, n * times, out);
  return cudaGetLastError();
}

cudaError_t AccumulateRepeats(const float* dy, int64_t n, int64_t times, float* dx, void* stream) {
  if (n == 0 || times == 0) return cudaSuccess;
  AccumulateRepeatsKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(dy, n, times, dx);
  return cudaGetLastError();
}

cudaError_t SoftmaxRows(const float* x, float* y, int64_t rows, int64_t cols, void* stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  SoftmaxKernel<<<Blocks(rows), kThreads, 0, Stream(stream)>>>(x, y, rows, cols);
  return cudaGetLastError();
}

cudaError_t SoftmaxRowsBackward(const float* y, const float* dy, float* dx, int64_t rows,
                                int64_t cols, void* stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<Blocks(rows), kThreads, 0, Stream(stream)>>>(y, dy, dx, rows, cols);
  return cudaGetLastError();
}

cudaError_t AddGated(const float* gate, int64_t experts, int64_t column, const float* x,
                     int64_t rows, int64_t n, float* acc, void* stream) {
  if (rows * n == 0) return cudaSuccess;
  AddGatedKernel<<<Blocks(rows * n), kThreads, 0, Stream(stream)>>>(gate, experts, column, x,
                                                                    rows, n, acc);
  return cudaGetLastError();
}

cudaError_t AddGatedBackward(const float* gate, int64_t experts, int64_t column, const float* x,
                             const float* dacc, int64_t rows, int64_t n, float* dx, float* dgate,
                             void* stream) {
  if (rows == 0) return cudaSuccess;
  AddGatedBackwardKernel<<<Blocks(rows * 32), kThreads, 0, Stream(stream)>>>(
      gate, experts, column, x, dacc, rows, n, dx, dgate);
  return cudaGetLastError();
}

cudaError_t ScaleBags(const float* sums, const int64_t* offsets, int64_t bags, int64_t dim,
                      bool mean, float* out, void* stream) {
  if (bags * dim == 0) return cudaSuccess;
  ScaleBagsKernel<<<Blocks(bags * dim), kThreads, 0, Stream(stream)>>>(sums, offsets, bags, dim,
                                                                       mean, out);
  return cudaGetLastError();
}

cudaError_t ExpandBags(const float* dpooled, const int64_t* offsets, int64_t bags, int64_t ids,
                       int64_t dim, bool mean, float* out, void* stream) {
  if (ids * dim == 0 || bags == 0) return cudaSuccess;
  ExpandBagsKernel<<<Blocks(ids * dim), kThreads, 0, Stream(stream)>>>(dpooled, offsets, bags,
                                                                       ids, dim, mean, out);
  return cudaGetLastError();
}

}  // namespace recfleet::engine::ops_cuda
