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

}  // namespace

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
