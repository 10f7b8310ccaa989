#ifndef RECFLEET_ENGINE_CUDA_DEVICE_H_
#define RECFLEET_ENGINE_CUDA_DEVICE_H_

// The CUDA device a process trains on, seen from the host: which devices
// there are, binding the process to one, host <-> device copies of tensor
// views, and GPU time on the engine's compute stream (the legacy default
// stream, engine/tensor.h). Every function fails with a Status when there
// is no driver or device; nothing here aborts.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace recfleet::engine {

// A CUDA device of this host.
struct CudaDeviceInfo {
  int index = 0;             // CUDA device index.
  std::string name;          // e.g. "NVIDIA H200".
  int64_t memory_bytes = 0;  // Total device memory.
};
// The CUDA devices this process sees; FailedPrecondition (naming the CUDA
// error) when there is no driver or no device.
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();
// Makes `index` the calling thread's current device. CudaAllocator() binds
// to the device current when it is first called, so a process trains on one
// device: call this before the first CudaAllocator() (recfleet-worker runs
// one process per GPU).
absl::Status SetCudaDevice(int index);
// Blocks until the legacy default stream (the engine's compute stream) has
// finished its work.
absl::Status SynchronizeCudaStream();

// Raw copies between a tensor view on either device and host bytes
// (view.nbytes() of them, same dtype, no conversion); synchronous, ordered
// after the legacy default stream's work. For checkpoints.
absl::Status CopyViewToHost(const TensorView& src, void* dst);
absl::Status CopyHostToView(const void* src, const TensorView& dst);

// GPU times between marks on the legacy default stream (the engine's
// compute stream), from CUDA events: Mark(i) enqueues event i; Seconds(from,
// to) waits for event `to` and returns the stream time between the two.
// Stream time counts the device's work, plus any time the device sat idle
// between the marks waiting for the host to issue more. Not thread-safe.
class CudaStreamTimer {
 public:
  explicit CudaStreamTimer(int marks) : events_(marks, nullptr) {}
  ~CudaStreamTimer();
  CudaStreamTimer(const CudaStreamTimer&) = delete;
  CudaStreamTimer& operator=(const CudaStreamTimer&) = delete;
  absl::Status Mark(int i);
  absl::StatusOr<double> Seconds(int from, int to);

 private:
  std::vector<void*> events_;  // cudaEvent_t, created on first use.
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_CUDA_DEVICE_H_
