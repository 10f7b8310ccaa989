#include "kernels/gemm/gemm_kernels.h"

#include <algorithm>

#include "kernels/base/cuda_util.h"

namespace recfleet::gemm_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

template <typename T>
__device__ __forceinline__ T ToElem(float v);
template <>
__device__ __forceinline__ float ToElem<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 ToElem<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

unsigned Grid(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(cuda_util::GridFor(n, 256), 65536));
}

__global__ void CastKernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                           int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

// Typed per (c, bias) pair, and no division per element: each thread keeps
// the column of its first element and steps it by the grid stride modulo n.
// A thread takes V consecutive elements of one row at a time (16 bytes of c
// when the caller has checked that n is a multiple of V and c is 16-byte
// aligned; V = 1 otherwise), and issues four such loads before its stores.
template <int V, typename C, typename B>
__global__ void AddBiasKernel(C* __restrict__ c, const B* __restrict__ bias, int64_t total,
                              int64_t n) {
  struct alignas(V * sizeof(C)) Pack {
    C v[V];
  };
  constexpr int kBatch = 4;
  const int64_t packs = total / V;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (start >= packs) return;
  Pack* __restrict__ cp = reinterpret_cast<Pack*>(c);
  const int64_t step = (stride * V) % n;
  int64_t col = (start * V) % n;
  for (int64_t i = start; i < packs; i += kBatch * stride) {
    Pack p[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t e = i + u * stride;
      if (e < packs) {
        p[u] = cp[e];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          p[u].v[k] = ToElem<C>(static_cast<float>(p[u].v[k]) + static_cast<float>(bias[col + k]));
        }
      }
      col += step;
      if (col >= n) col -= n;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t e = i + u * stride;
      if (e < packs) cp[e] = p[u];
    }
  }
}

// Launches the widest AddBiasKernel that c's alignment and n allow.
template <typename C, typename B>
void LaunchAddBias(C* c, const B* bias, int64_t total, int64_t n, cudaStream_t s) {
  constexpr int kWide = 16 / sizeof(C);
  // About 8 packs per thread, so that its two divisions are shared.
  if (n % kWide == 0 && reinterpret_cast<uintptr_t>(c) % 16 == 0) {
    AddBiasKernel<kWide><<<Grid((total / kWide + 7) / 8), 256, 0, s>>>(c, bias, total, n);
  } else {
    AddBiasKernel<1><<<Grid((total + 7) / 8), 256, 0, s>>>(c, bias, total, n);
  }
}

__global__ void PartialColumnSums(const void* dy, int dy_type, int64_t m, int64_t n,
                                  int64_t rows_per_chunk, float* __restrict__ part) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
  // Four running sums, so that four loads are in flight (fixed order:
  // deterministic).
  const ElemType t = ElemType(dy_type);
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t r = r0;
  for (; r + 3 < r1; r += 4) {
    s0 += LoadF(dy, t, r * n + col);
    s1 += LoadF(dy, t, (r + 1) * n + col);
    s2 += LoadF(dy, t, (r + 2) * n + col);
    s3 += LoadF(dy, t, (r + 3) * n + col);
  }
  for (; r < r1; ++r) s0 += LoadF(dy, t, r * n + col);
  part[blockIdx.y * n + col] = (s0 + s1) + (s2 + s3);
}

// One warp per column: its lanes split the chunks, then a fixed butterfly
// sums the lanes (deterministic). The old thread-per-column loop waited on
// 256 dependent loads in a row.
__global__ void FinishColumnSums(const float* __restrict__ part, int64_t chunks, int64_t n,
                                 bool accumulate, void* out, int out_type) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (col >= n) return;  // whole warps leave together: col is uniform in a warp
  float s = 0;
  for (int64_t k = lane; k < chunks; k += 32) s += part[k * n + col];
  s = cuda_util::WarpSum(s);
  if (lane == 0) {
    if (accumulate) s += LoadF(out, ElemType(out_type), col);
    StoreF(out, ElemType(out_type), col, s);
  }
}

// One 128 x 128 tile (one scale) per block of 256 threads, through shared
// memory rows of 132 bytes (33 words: the column reads below hit 32
// different banks). kVec (every pointer 16-byte aligned, rows and cols
// multiples of 16): rows are read and copied as 16-byte words, 8 threads
// per row; the transpose is written as 16-byte words, 8 threads per output
// row of 128 bytes, each gathering its 16 bytes from 16 tile rows (in an
// order rotated by its position, so the warp's reads spread over the
// banks). Otherwise byte by byte. The thread that starts a tile places its
// scale in both layouts.
constexpr int kCodeTile = 128;
constexpr int kCodeStride = kCodeTile + 4;

template <bool kVec>
__global__ void Fp8WeightFromCodesKernel(const uint8_t* __restrict__ q,
                                         const float* __restrict__ tile_scales, int64_t rows,
                                         int64_t cols, uint8_t* __restrict__ w_q,
                                         float* __restrict__ w_scales, int64_t w_stride,
                                         uint8_t* __restrict__ wt_q, float* __restrict__ wt_scales,
                                         int64_t wt_stride) {
  __shared__ uint32_t tile[kCodeTile * kCodeStride / 4];
  uint8_t* bytes = reinterpret_cast<uint8_t*>(tile);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCodeTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCodeTile;
  const int t = threadIdx.x;
  if (kVec) {
    for (int i = t; i < kCodeTile * kCodeTile / 16; i += blockDim.x) {
      const int r = i / 8, c = (i % 8) * 16;
      const int64_t gr = r0 + r, gc = c0 + c;
      if (gr >= rows || gc >= cols) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(q + gr * cols + gc);
      *reinterpret_cast<uint4*>(w_q + gr * cols + gc) = v;
      uint32_t* row = tile + r * (kCodeStride / 4) + c / 4;
      row[0] = v.x, row[1] = v.y, row[2] = v.z, row[3] = v.w;
    }
    __syncthreads();
    for (int i = t; i < kCodeTile * kCodeTile / 16; i += blockDim.x) {
      const int c = i / 8, part = i % 8, rb = part * 16;
      const int64_t gc = c0 + c, gr = r0 + rb;
      if (gc >= cols || gr >= rows) continue;
      uint32_t word[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int k = (j + 2 * part) % 16;
        word[k / 4] |= static_cast<uint32_t>(bytes[(rb + k) * kCodeStride + c]) << (8 * (k % 4));
      }
      *reinterpret_cast<uint4*>(wt_q + gc * rows + gr) = make_uint4(word[0], word[1], word[2], word[3]);
    }
  } else {
    for (int i = t; i < kCodeTile * kCodeTile; i += blockDim.x) {
      const int r = i / kCodeTile, c = i % kCodeTile;
      const int64_t gr = r0 + r, gc = c0 + c;
      if (gr >= rows || gc >= cols) continue;
      const uint8_t v = q[gr * cols + gc];
      w_q[gr * cols + gc] = v;
      bytes[r * kCodeStride + c] = v;
    }
    __syncthreads();
    for (int i = t; i < kCodeTile * kCodeTile; i += blockDim.x) {
      const int c = i / kCodeTile, r = i % kCodeTile;
      const int64_t gc = c0 + c, gr = r0 + r;
      if (gc >= cols || gr >= rows) continue;
      wt_q[gc * rows + gr] = bytes[r * kCodeStride + c];
    }
  }
  if (t == 0) {
    const int64_t ti = blockIdx.y, tj = blockIdx.x, tile_cols = (cols + kCodeTile - 1) / kCodeTile;
    const float scale = tile_scales[ti * tile_cols + tj];
    w_scales[ti * w_stride + tj] = scale;
    wt_scales[tj * wt_stride + ti] = scale;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t Fp8WeightFromCodes(const uint8_t* q, const float* tile_scales, int64_t rows,
                               int64_t cols, uint8_t* w_q, float* w_scales, int64_t w_stride,
                               uint8_t* wt_q, float* wt_scales, int64_t wt_stride, void* stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t gx = (cols + kCodeTile - 1) / kCodeTile, gy = (rows + kCodeTile - 1) / kCodeTile;
  if (gy > 65535 || gx > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  const auto s = static_cast<cudaStream_t>(stream);
  if (rows % 16 == 0 && cols % 16 == 0 && Aligned16(q) && Aligned16(w_q) && Aligned16(wt_q)) {
    Fp8WeightFromCodesKernel<true><<<grid, 256, 0, s>>>(q, tile_scales, rows, cols, w_q, w_scales,
                                                        w_stride, wt_q, wt_scales, wt_stride);
  } else {
    Fp8WeightFromCodesKernel<false><<<grid, 256, 0, s>>>(q, tile_scales, rows, cols, w_q, w_scales,
                                                         w_stride, wt_q, wt_scales, wt_stride);
  }
  return cudaGetLastError();
}

cudaError_t CastToBf16(const float* in, void* out, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<<<Grid(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, static_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

cudaError_t AddBias(void* c, int c_type, const void* bias, int bias_type, int64_t m, int64_t n,
                    void* stream) {
  if (m * n == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t total = m * n;
  const bool c16 = ElemType(c_type) == ElemType::kBFloat16;
  const bool b16 = ElemType(bias_type) == ElemType::kBFloat16;
  using Bf = __nv_bfloat16;
  if (c16 && b16) {
    LaunchAddBias(static_cast<Bf*>(c), static_cast<const Bf*>(bias), total, n, s);
  } else if (c16) {
    LaunchAddBias(static_cast<Bf*>(c), static_cast<const float*>(bias), total, n, s);
  } else if (b16) {
    LaunchAddBias(static_cast<float*>(c), static_cast<const Bf*>(bias), total, n, s);
  } else {
    LaunchAddBias(static_cast<float*>(c), static_cast<const float*>(bias), total, n, s);
  }
  return cudaGetLastError();
}

cudaError_t ColumnSums(const void* dy, int dy_type, int64_t m, int64_t n, bool accumulate,
                       void* dbias, int dbias_type, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(m, 256));
  const int64_t rows_per_chunk = std::max<int64_t>(1, (m + chunks - 1) / chunks);
  float* part = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&part),
                                    static_cast<size_t>(chunks * n) * sizeof(float), s);
  if (err != cudaSuccess) return err;
  PartialColumnSums<<<dim3(cuda_util::GridFor(n, 256), static_cast<unsigned>(chunks)), 256, 0, s>>>(
      dy, dy_type, m, n, rows_per_chunk, part);
  FinishColumnSums<<<cuda_util::GridFor(n * 32, 256), 256, 0, s>>>(part, chunks, n, accumulate,
                                                                   dbias, dbias_type);
  err = cudaGetLastError();
  const cudaError_t free_err = cudaFreeAsync(part, s);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::gemm_cuda
