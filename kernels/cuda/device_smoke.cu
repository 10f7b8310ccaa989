// A minimal kernel proving the nvcc -> cc_library -> cc_test path.
#include "kernels/cuda/device_smoke.h"

#include <cuda_runtime.h>

#include <string>

namespace recfleet::cuda {
namespace {

__global__ void SaxpyKernel(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

std::string Err(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

std::string DescribeDevice() {
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) return Err("cudaGetDeviceProperties", e);
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " +
         std::to_string(prop.multiProcessorCount) + " SMs";
}

std::string Saxpy(float a, const float* x, float* y, int n) {
  float* dx = nullptr;
  float* dy = nullptr;
  size_t bytes = sizeof(float) * static_cast<size_t>(n);
  std::string error;
  cudaError_t e;
  if ((e = cudaMalloc(&dx, bytes)) != cudaSuccess) return Err("cudaMalloc", e);
  if ((e = cudaMalloc(&dy, bytes)) != cudaSuccess) {
    cudaFree(dx);
    return Err("cudaMalloc", e);
  }
  if ((e = cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (e = cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    error = Err("cudaMemcpy H2D", e);
  } else {
    SaxpyKernel<<<(n + 255) / 256, 256>>>(a, dx, dy, n);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      error = Err("SaxpyKernel launch", e);
    } else if ((e = cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      error = Err("cudaMemcpy D2H", e);
    }
  }
  cudaFree(dx);
  cudaFree(dy);
  return error;
}

}  // namespace recfleet::cuda
