#ifndef RECFLEET_ENGINE_TENSOR_H_
#define RECFLEET_ENGINE_TENSOR_H_

// Owned tensors for the training engine. A Tensor owns a contiguous
// row-major buffer obtained from an Allocator (host memory, or CUDA device
// memory from CudaAllocator()) and hands out the non-owning TensorView
// that every kernel takes. A JaggedTensor owns the values and int64 offsets
// of a batch of variable-length sequences or id lists (see JaggedView).
//
// Tensors are move-only; moving transfers ownership. Not thread-safe: one
// owner at a time. Allocators are thread-safe.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace recfleet::engine {

// Where tensor storage comes from. Implementations must be thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns `bytes` of storage aligned to at least 64 bytes, or
  // ResourceExhausted. `bytes` may be 0 (returns a non-null pointer).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Releases storage from Allocate with the same `bytes`.
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
  // Sets `bytes` bytes at `ptr` (storage from this allocator) to zero.
  virtual absl::Status Zero(void* ptr, size_t bytes) = 0;
};

// The process-wide host allocator (aligned operator new).
Allocator* CpuAllocator();

// Bytes CpuAllocator() has handed out and not taken back, and the most of
// them since the last ResetCpuMemoryPeak (all threads together).
struct HostMemoryStats {
  uint64_t in_use = 0;
  uint64_t peak = 0;
};
HostMemoryStats CpuMemoryStats();
void ResetCpuMemoryPeak();

// The engine's CUDA compute stream on this thread (a cudaStream_t): the
// legacy default stream (nullptr) unless a ScopedComputeStream is alive.
// Every CUDA operation of the engine's layers, and the device allocator's
// allocations, frees and memsets, go to it; a region that moves to another
// stream (the model's CUDA graphs, which cannot capture the legacy stream)
// orders itself against the legacy stream with events.
void* ComputeStream();

// Makes `stream` this thread's compute stream until destroyed (nestable).
class ScopedComputeStream {
 public:
  explicit ScopedComputeStream(void* stream);
  ~ScopedComputeStream();
  ScopedComputeStream(const ScopedComputeStream&) = delete;
  ScopedComputeStream& operator=(const ScopedComputeStream&) = delete;

 private:
  void* previous_;
};

// The process-wide allocator of the current CUDA device: stream-ordered
// (cudaMallocAsync / cudaFreeAsync on ComputeStream(), the legacy default
// stream by default) from the device's default memory pool, whose
// release threshold is raised so that freed blocks stay reserved and are
// reused without a driver call: a caching allocator. Zero() is an
// asynchronous memset on that stream. FailedPrecondition without a CUDA
// device.
absl::StatusOr<Allocator*> CudaAllocator();

// Device memory of CudaAllocator()'s pool, in bytes.
struct DeviceMemoryStats {
  uint64_t in_use = 0;    // Handed out and not yet freed.
  uint64_t peak = 0;      // Highest in_use since the last ResetPeak.
  uint64_t reserved = 0;  // Held by the pool (in use + cached).
};
absl::StatusOr<DeviceMemoryStats> CudaMemoryStats();
absl::Status ResetCudaMemoryPeak();

class Tensor {
 public:
  Tensor() = default;
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Uninitialized storage for `shape` (every dimension >= 0).
  static absl::StatusOr<Tensor> Empty(DType dtype, Shape shape,
                                      Allocator* allocator = CpuAllocator());
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape,
                                      Allocator* allocator = CpuAllocator());
  // Host-side convenience for the CPU engine: zero-filled host tensor.
  // Aborts on allocation failure, like std::vector.
  static Tensor HostZeros(DType dtype, Shape shape);

  // A deep copy on the same allocator.
  absl::StatusOr<Tensor> Clone() const;
  // A deep copy on `allocator` (host <-> device or device <-> device;
  // synchronous).
  absl::StatusOr<Tensor> CopyTo(Allocator* allocator) const;
  absl::Status SetZero();

  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  const Shape& shape() const { return view_.shape; }
  int64_t dim(int64_t i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool empty() const { return view_.data == nullptr; }

  // Typed host access; the caller must match dtype().
  template <typename T>
  T* data() const {
    return view_.as<T>();
  }

 private:
  void Release();

  TensorView view_;
  size_t capacity_ = 0;
  Allocator* allocator_ = nullptr;
};

// A batch of variable-length rows of `values` (shape [total, ...]) with
// int64 offsets of length batch_size + 1 kept on the host.
class JaggedTensor {
 public:
  JaggedTensor() = default;
  // Builds the offsets from `lengths` (each >= 0) and allocates values of
  // shape [sum(lengths), inner...] zero-filled on the host.
  static absl::StatusOr<JaggedTensor> FromLengths(DType dtype, const std::vector<int64_t>& lengths,
                                                  Shape inner);

  JaggedView view() const;
  int64_t batch_size() const { return offsets_.numel() - 1; }
  int64_t total_length() const { return values_.dim(0); }
  int64_t offset(int64_t b) const { return offsets_.data<int64_t>()[b]; }
  int64_t length(int64_t b) const { return offset(b + 1) - offset(b); }
  Tensor& values() { return values_; }
  const Tensor& values() const { return values_; }
  const Tensor& offsets() const { return offsets_; }

 private:
  Tensor values_;
  Tensor offsets_;
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TENSOR_H_
