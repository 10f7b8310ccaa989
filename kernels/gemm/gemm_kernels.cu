#include "kernels/gemm/gemm_kernels.h"

#include <algorithm>

#include "kernels/base/cuda_util.h"

namespace recfleet::gemm_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

__global__ void CastKernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                           int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void AddBiasKernel(void* c, int c_type, const void* bias, int bias_type, int64_t m,
                              int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreF(c, ElemType(c_type), i,
           LoadF(c, ElemType(c_type), i) + LoadF(bias, ElemType(bias_type), i % n));
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

__global__ void FinishColumnSums(const float* __restrict__ part, int64_t chunks, int64_t n,
                                 bool accumulate, void* out, int out_type) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  float s = accumulate ? LoadF(out, ElemType(out_type), col) : 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += part[k * n + col];
  StoreF(out, ElemType(out_type), col, s);
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
  AddBiasKernel<<<Grid(m * n), 256, 0, static_cast<cudaStream_t>(stream)>>>(c, c_type, bias,
                                                                           bias_type, m, n);
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
  FinishColumnSums<<<cuda_util::GridFor(n, 256), 256, 0, s>>>(part, chunks, n, accumulate, dbias,
                                                              dbias_type);
  err = cudaGetLastError();
  const cudaError_t free_err = cudaFreeAsync(part, s);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::gemm_cuda
