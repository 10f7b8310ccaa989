#ifndef RECFLEET_WORKER_DIST_DEVICE_BUFFER_H_
#define RECFLEET_WORKER_DIST_DEVICE_BUFFER_H_

// Owned storage on the host or on the current CUDA device, with copies to
// and from host memory. Distributed building blocks keep their messages
// and the ids they route in these buffers on the communicators' device, and
// stage the little bookkeeping that stays on the host (counts, the
// exchanges not yet moved to the device) through them.
// Move-only; not thread-safe.

#include <cstddef>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace recfleet {
namespace dist {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` of zeroed storage on `device` (kCuda: the current device).
  static absl::StatusOr<DeviceBuffer> Zeros(Device device, size_t bytes);
  // A copy of `bytes` of host memory on `device`.
  static absl::StatusOr<DeviceBuffer> FromHost(Device device, const void* host, size_t bytes);

  absl::Status CopyFromHost(const void* host, size_t bytes);
  absl::Status CopyToHost(void* host, size_t bytes) const;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }
  TensorView View(DType dtype, Shape shape) const { return MakeView(data_, dtype, std::move(shape), device_); }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Copies between a view's storage (host or CUDA) and host memory.
absl::Status CopyViewToHost(const TensorView& view, void* host);
absl::Status CopyHostToView(const void* host, const TensorView& view);

// Copies `bytes` between two buffers on `device`: memcpy on the host; on
// CUDA an asynchronous device-to-device copy on the legacy default stream,
// so it is ordered after the engine's work queued there and before any
// collective (whose blocking stream waits for that stream).
absl::Status CopyOnDevice(Device device, void* dst, const void* src, size_t bytes);

// `rows` rows of `width` bytes from `src` (rows `src_pitch` bytes apart) to
// `dst` (rows `dst_pitch` bytes apart) on `device`, ordered like
// CopyOnDevice: a column slice of a matrix into a packed one and back.
absl::Status Copy2DOnDevice(Device device, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                            size_t width, int64_t rows);

// Zeroes `bytes` at `dst` on `device`, ordered like CopyOnDevice.
absl::Status ZeroOnDevice(Device device, void* dst, size_t bytes);

// Waits for everything queued on the legacy default stream of the current
// CUDA device (no-op on the host): where a rank's compute time ends.
absl::Status SynchronizeDevice(Device device);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_DEVICE_BUFFER_H_
