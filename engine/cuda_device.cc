#include "engine/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"

namespace recfleet::engine {

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device usable: ", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible to this process");
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (absl::Status s = CudaStatus(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
        !s.ok()) {
      return s;
    }
    devices.push_back({i, prop.name, static_cast<int64_t>(prop.totalGlobalMem)});
  }
  return devices;
}

absl::Status SetCudaDevice(int index) { return CudaStatus(cudaSetDevice(index), "cudaSetDevice"); }

absl::Status SynchronizeCudaStream() {
  return CudaStatus(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

absl::Status CopyViewToHost(const TensorView& src, void* dst) {
  if (src.nbytes() == 0) return absl::OkStatus();
  if (src.device == Device::kCpu) {
    std::memcpy(dst, src.data, src.nbytes());
    return absl::OkStatus();
  }
  return CudaStatus(cudaMemcpy(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost), "copy to host");
}

absl::Status CopyHostToView(const void* src, const TensorView& dst) {
  if (dst.nbytes() == 0) return absl::OkStatus();
  if (dst.device == Device::kCpu) {
    std::memcpy(dst.data, src, dst.nbytes());
    return absl::OkStatus();
  }
  return CudaStatus(cudaMemcpy(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice), "copy to device");
}

CudaStreamTimer::~CudaStreamTimer() {
  for (void* e : events_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
}

absl::Status CudaStreamTimer::Mark(int i) {
  if (i < 0 || i >= static_cast<int>(events_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("CudaStreamTimer: no mark ", i));
  }
  if (events_[i] == nullptr) {
    cudaEvent_t event;
    if (absl::Status s = CudaStatus(cudaEventCreate(&event), "cudaEventCreate"); !s.ok()) return s;
    events_[i] = event;
  }
  return CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(events_[i]), nullptr), "cudaEventRecord");
}

absl::StatusOr<double> CudaStreamTimer::Seconds(int from, int to) {
  const int n = static_cast<int>(events_.size());
  if (from < 0 || to < 0 || from >= n || to >= n || events_[from] == nullptr || events_[to] == nullptr) {
    return absl::FailedPreconditionError("CudaStreamTimer::Seconds of a mark not recorded");
  }
  if (absl::Status s = CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[to])),
                                  "cudaEventSynchronize");
      !s.ok()) {
    return s;
  }
  float ms = 0;
  if (absl::Status s = CudaStatus(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[from]),
                                                       static_cast<cudaEvent_t>(events_[to])),
                                  "cudaEventElapsedTime");
      !s.ok()) {
    return s;
  }
  return ms * 1e-3;
}

}  // namespace recfleet::engine
