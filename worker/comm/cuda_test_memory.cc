#include "worker/comm/cuda_test_memory.h"

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace recfleet {
namespace comm {

void* CudaTestMemory::Alloc(int rank, size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  return p;
}

void CudaTestMemory::Free(int rank, void* p) {
  cudaSetDevice(rank);
  cudaFree(p);
}

void CudaTestMemory::Upload(int rank, void* dst, const void* src, size_t bytes) {
  cudaSetDevice(rank);
  EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

void CudaTestMemory::Download(int rank, void* dst, const void* src, size_t bytes) {
  cudaSetDevice(rank);
  EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace comm
}  // namespace recfleet
