#ifndef RECFLEET_KERNELS_BASE_DEVICE_BUFFER_H_
#define RECFLEET_KERNELS_BASE_DEVICE_BUFFER_H_

// An owning device allocation for tests and benchmarks that move host data
// to the GPU and back. Aborts on CUDA errors (test code only).

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/tensor.h"

namespace recfleet {

inline void CudaOrDie(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    CudaOrDie(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    CudaOrDie(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  TensorView View(DType dtype, Shape shape) const {
    return MakeView(ptr_, dtype, std::move(shape), Device::kCuda);
  }
  template <typename T>
  std::vector<T> ToHost() const {
    CudaOrDie(cudaDeviceSynchronize(), "kernel");
    std::vector<T> out(bytes_ / sizeof(T));
    CudaOrDie(cudaMemcpy(out.data(), ptr_, out.size() * sizeof(T), cudaMemcpyDeviceToHost),
              "cudaMemcpy D2H");
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_DEVICE_BUFFER_H_
