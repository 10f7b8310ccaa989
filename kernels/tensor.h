#ifndef RECFLEET_KERNELS_TENSOR_H_
#define RECFLEET_KERNELS_TENSOR_H_

// Non-owning views of dense and jagged tensors: the currency of the kernel
// API. Every kernel (CPU reference and CUDA) takes views, validates them with
// the helpers below and returns an absl::Status; none of them allocates the
// caller's outputs. Views are cheap to copy and never own memory; whoever
// made the storage keeps it alive for the duration of the call.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recfleet {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,  // CPU only: gradient checks and exact references.
  kBFloat16,
  kFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kInt32,
  kInt64,
};

enum class Device : uint8_t { kCpu, kCuda };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "fp32", "bf16", "fp8_e4m3", ... (stable: used in error messages and logs).
absl::string_view DTypeName(DType dtype);
absl::string_view DeviceName(Device device);

using Shape = absl::InlinedVector<int64_t, 4>;

// A strided-free (row-major, contiguous) view of `numel(shape)` elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }

  // "bf16[4, 128] on cuda".
  std::string DebugString() const;
};

// Makes a view over caller-owned memory.
TensorView MakeView(void* data, DType dtype, Shape shape, Device device = Device::kCpu);

// A batch of variable-length sequences (or id lists), stored without padding:
// sequence b occupies rows [offsets[b], offsets[b+1]) of `values`, whose first
// dimension is the total length. `offsets` is int32 or int64, of length B + 1,
// non-decreasing, starting at 0 and ending at values.dim(0).
struct JaggedView {
  TensorView values;
  TensorView offsets;

  int64_t batch_size() const { return offsets.numel() - 1; }
  int64_t total_length() const { return values.rank() > 0 ? values.dim(0) : 0; }
  // Offset b as int64, whatever the stored index type (host memory only).
  int64_t offset(int64_t b) const;
  int64_t length(int64_t b) const { return offset(b + 1) - offset(b); }
};

// Validation helpers for kernel launchers. Each returns InvalidArgument with
// a message naming `what` (e.g. "q") and the expected form.
absl::Status CheckDType(const TensorView& t, absl::string_view what, std::initializer_list<DType> allowed);
absl::Status CheckRank(const TensorView& t, absl::string_view what, int64_t rank);
absl::Status CheckDim(const TensorView& t, absl::string_view what, int64_t axis, int64_t expected);
absl::Status CheckDevice(const TensorView& t, absl::string_view what, Device device);
// Checks index dtype, rank, length, monotonicity and the end offset (the
// offsets must be readable on the host, i.e. device kCpu).
absl::Status CheckJagged(const JaggedView& j, absl::string_view what);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_TENSOR_H_
