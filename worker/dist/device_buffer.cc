#include "worker/dist/device_buffer.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace dist {
namespace {

absl::Status Cuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status Copy(Device device, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return absl::OkStatus();
  if (device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  return Cuda(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

}  // namespace

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (data_ == nullptr) return;
  if (device_ == Device::kCpu) {
    std::free(data_);
  } else {
    cudaFree(data_);
  }
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Zeros(Device device, size_t bytes) {
  DeviceBuffer b;
  b.device_ = device;
  b.size_ = bytes;
  // Never null, even for 0 bytes: views of empty buffers stay valid.
  const size_t alloc = bytes > 0 ? bytes : 1;
  if (device == Device::kCpu) {
    b.data_ = std::calloc(alloc, 1);
    if (b.data_ == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " host bytes"));
    return b;
  }
  if (absl::Status s = Cuda(cudaMalloc(&b.data_, alloc), absl::StrCat("cudaMalloc(", bytes, ")")); !s.ok()) {
    b.data_ = nullptr;
    return s;
  }
  if (absl::Status s = Cuda(cudaMemset(b.data_, 0, alloc), "cudaMemset"); !s.ok()) return s;
  return b;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::FromHost(Device device, const void* host, size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = Zeros(device, bytes);
  if (!b.ok()) return b.status();
  if (absl::Status s = b->CopyFromHost(host, bytes); !s.ok()) return s;
  return b;
}

absl::Status DeviceBuffer::CopyFromHost(const void* host, size_t bytes) {
  if (bytes > size_) return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes into ", size_));
  return Copy(device_, data_, host, bytes, cudaMemcpyHostToDevice);
}

absl::Status DeviceBuffer::CopyToHost(void* host, size_t bytes) const {
  if (bytes > size_) return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes from ", size_));
  return Copy(device_, host, data_, bytes, cudaMemcpyDeviceToHost);
}

absl::Status CopyViewToHost(const TensorView& view, void* host) {
  return Copy(view.device, host, view.data, view.nbytes(), cudaMemcpyDeviceToHost);
}

absl::Status CopyHostToView(const void* host, const TensorView& view) {
  return Copy(view.device, view.data, host, view.nbytes(), cudaMemcpyHostToDevice);
}

absl::Status CopyOnDevice(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  return Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
}

absl::Status Copy2DOnDevice(Device device, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                            size_t width, int64_t rows) {
  if (rows == 0 || width == 0) return absl::OkStatus();
  if (device == Device::kCpu) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    }
    return absl::OkStatus();
  }
  return Cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, nullptr),
              "cudaMemcpy2DAsync");
}

absl::Status ZeroOnDevice(Device device, void* dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device == Device::kCpu) {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  return Cuda(cudaMemsetAsync(dst, 0, bytes, nullptr), "cudaMemsetAsync");
}

absl::Status SynchronizeDevice(Device device) {
  if (device == Device::kCpu) return absl::OkStatus();
  return Cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

}  // namespace dist
}  // namespace recfleet
