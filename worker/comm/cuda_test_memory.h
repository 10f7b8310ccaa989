#ifndef RECFLEET_WORKER_COMM_CUDA_TEST_MEMORY_H_
#define RECFLEET_WORKER_COMM_CUDA_TEST_MEMORY_H_

// TestMemory on GPUs for tests of the NCCL backend: rank r's buffers live on
// CUDA device r.

#include "worker/comm/conformance.h"

namespace recfleet {
namespace comm {

class CudaTestMemory : public TestMemory {
 public:
  Device device() const override { return Device::kCuda; }
  void* Alloc(int rank, size_t bytes) override;
  void Free(int rank, void* p) override;
  void Upload(int rank, void* dst, const void* src, size_t bytes) override;
  void Download(int rank, void* dst, const void* src, size_t bytes) override;
};

// Visible CUDA devices (0 when the runtime finds none).
int CudaDeviceCount();

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_CUDA_TEST_MEMORY_H_
