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

__global__ void CastKernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                           int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

// Typed per (c, bias) pair, and no division per element: each thread keeps
// the column of its element and steps it by the grid stride modulo n. Four
// elements' loads are issued before their stores, so that each thread keeps
// several loads in flight.
template <typename C, typename B>
__global__ void AddBiasKernel(C* __restrict__ c, const B* __restrict__ bias, int64_t total,
                              int64_t n) {
  constexpr int kBatch = 4;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (start >= total) return;
  const int64_t step = stride % n;
  int64_t col = start % n;
  for (int64_t i = start; i < total; i += kBatch * stride) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t e = i + u * stride;
      if (e < total) v[u] = static_cast<float>(c[e]) + static_cast<float>(bias[col]);
      col += step;
      if (col >= n) col -= n;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t e = i + u * stride;
      if (e < total) c[e] = ToElem<C>(v[u]);
    }
  }
}

__global__ void PartialColumnSums(const void* dy, int dy_type, int64_t m, int64_t n,
                                  int64_t rows_per_chunk, float* __restrict__ part) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
  float s = 0;
  for (int64_t r = r0; r < r1; ++r) s += LoadF(dy, ElemType(dy_type), r * n + col);
  part[blockIdx.y * n + col] = s;
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

unsigned Grid(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(cuda_util::GridFor(n, 256), 65536));
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
  // About 8 elements per thread, so that its two divisions are shared.
  const unsigned grid = Grid((total + 7) / 8);
  const bool c16 = ElemType(c_type) == ElemType::kBFloat16;
  const bool b16 = ElemType(bias_type) == ElemType::kBFloat16;
  using Bf = __nv_bfloat16;
  if (c16 && b16) {
    AddBiasKernel<<<grid, 256, 0, s>>>(static_cast<Bf*>(c), static_cast<const Bf*>(bias), total, n);
  } else if (c16) {
    AddBiasKernel<<<grid, 256, 0, s>>>(static_cast<Bf*>(c), static_cast<const float*>(bias), total,
                                       n);
  } else if (b16) {
    AddBiasKernel<<<grid, 256, 0, s>>>(static_cast<float*>(c), static_cast<const Bf*>(bias), total,
                                       n);
  } else {
    AddBiasKernel<<<grid, 256, 0, s>>>(static_cast<float*>(c), static_cast<const float*>(bias),
                                       total, n);
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
