#include "engine/tensor.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"

namespace recfleet::engine {
namespace {

constexpr std::align_val_t kAlignment{64};

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = ::operator new(bytes == 0 ? 1 : bytes, kAlignment, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    const uint64_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    ::operator delete(ptr, kAlignment);
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  HostMemoryStats Stats() const {
    return {in_use_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed)};
  }
  void ResetPeak() { peak_.store(in_use_.load(std::memory_order_relaxed), std::memory_order_relaxed); }
  absl::Status Zero(void* ptr, size_t bytes) override {
    std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }

 private:
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
};

thread_local void* compute_stream = nullptr;

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(cudaMemPool_t pool) : pool_(pool) {}
  Device device() const override { return Device::kCuda; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    // The engine's compute stream (the legacy default stream by default).
    const cudaError_t err = cudaMallocFromPoolAsync(&p, bytes == 0 ? 1 : bytes, pool_,
                                                    static_cast<cudaStream_t>(ComputeStream()));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("device allocation of ", bytes,
                                                       " bytes failed: ", cudaGetErrorString(err)));
    }
    return p;
  }
  void Deallocate(void* ptr, size_t) override {
    cudaFreeAsync(ptr, static_cast<cudaStream_t>(ComputeStream()));
  }
  absl::Status Zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(
        cudaMemsetAsync(ptr, 0, bytes, static_cast<cudaStream_t>(ComputeStream())),
        "device memset");
  }
  cudaMemPool_t pool() const { return pool_; }

 private:
  cudaMemPool_t pool_;
};

absl::StatusOr<DeviceAllocator*> Device0Allocator() {
  static absl::StatusOr<DeviceAllocator*>* allocator = [] {
    auto* result = new absl::StatusOr<DeviceAllocator*>();
    int device = 0, count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      *result = absl::FailedPreconditionError("no CUDA device is visible to this process");
      return result;
    }
    cudaMemPool_t pool;
    if (absl::Status s = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) {
      *result = s;
      return result;
    }
    if (absl::Status s = CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "memory pool");
        !s.ok()) {
      *result = s;
      return result;
    }
    uint64_t keep = UINT64_MAX;  // Cache freed blocks instead of returning them.
    if (absl::Status s = CudaStatus(
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "memory pool");
        !s.ok()) {
      *result = s;
      return result;
    }
    *result = new DeviceAllocator(pool);
    return result;
  }();
  return *allocator;
}

}  // namespace

absl::StatusOr<Allocator*> CudaAllocator() {
  absl::StatusOr<DeviceAllocator*> a = Device0Allocator();
  if (!a.ok()) return a.status();
  return *a;
}

absl::StatusOr<DeviceMemoryStats> CudaMemoryStats() {
  absl::StatusOr<DeviceAllocator*> a = Device0Allocator();
  if (!a.ok()) return a.status();
  DeviceMemoryStats stats;
  const cudaMemPool_t pool = (*a)->pool();
  for (auto [attr, out] : {std::pair{cudaMemPoolAttrUsedMemCurrent, &stats.in_use},
                           std::pair{cudaMemPoolAttrUsedMemHigh, &stats.peak},
                           std::pair{cudaMemPoolAttrReservedMemCurrent, &stats.reserved}}) {
    uint64_t v = 0;
    if (absl::Status s = CudaStatus(cudaMemPoolGetAttribute(pool, attr, &v), "memory pool stats");
        !s.ok()) {
      return s;
    }
    *out = v;
  }
  return stats;
}

absl::Status ResetCudaMemoryPeak() {
  absl::StatusOr<DeviceAllocator*> a = Device0Allocator();
  if (!a.ok()) return a.status();
  uint64_t zero = 0;
  return CudaStatus(cudaMemPoolSetAttribute((*a)->pool(), cudaMemPoolAttrUsedMemHigh, &zero),
                    "memory pool peak reset");
}

static HostAllocator* TheHostAllocator() {
  static HostAllocator* allocator = new HostAllocator();
  return allocator;
}

Allocator* CpuAllocator() { return TheHostAllocator(); }

HostMemoryStats CpuMemoryStats() { return TheHostAllocator()->Stats(); }

void ResetCpuMemoryPeak() { TheHostAllocator()->ResetPeak(); }

Tensor::~Tensor() { Release(); }

Tensor::Tensor(Tensor&& other) noexcept
    : view_(std::move(other.view_)), capacity_(other.capacity_), allocator_(other.allocator_) {
  other.view_ = TensorView();
  other.capacity_ = 0;
  other.allocator_ = nullptr;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = std::move(other.view_);
    capacity_ = other.capacity_;
    allocator_ = other.allocator_;
    other.view_ = TensorView();
    other.capacity_ = 0;
    other.allocator_ = nullptr;
  }
  return *this;
}

void Tensor::Release() {
  if (allocator_ != nullptr && view_.data != nullptr) allocator_->Deallocate(view_.data, capacity_);
  view_.data = nullptr;
  allocator_ = nullptr;
  capacity_ = 0;
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, Shape shape, Allocator* allocator) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape dimension ", i, " must be >= 0, got ", shape[i]));
    }
  }
  Tensor t;
  t.view_ = MakeView(nullptr, dtype, std::move(shape), allocator->device());
  t.capacity_ = t.view_.nbytes();
  absl::StatusOr<void*> p = allocator->Allocate(t.capacity_);
  if (!p.ok()) return p.status();
  t.view_.data = *p;
  t.allocator_ = allocator;
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape, Allocator* allocator) {
  absl::StatusOr<Tensor> t = Empty(dtype, std::move(shape), allocator);
  if (!t.ok()) return t.status();
  if (absl::Status s = t->SetZero(); !s.ok()) return s;
  return t;
}

Tensor Tensor::HostZeros(DType dtype, Shape shape) {
  absl::StatusOr<Tensor> t = Zeros(dtype, std::move(shape), CpuAllocator());
  if (!t.ok()) std::abort();
  return *std::move(t);
}

absl::StatusOr<Tensor> Tensor::Clone() const {
  return CopyTo(allocator_ ? allocator_ : CpuAllocator());
}

absl::StatusOr<Tensor> Tensor::CopyTo(Allocator* allocator) const {
  absl::StatusOr<Tensor> t = Empty(dtype(), shape(), allocator);
  if (!t.ok()) return t.status();
  if (nbytes() == 0) return t;
  if (device() == Device::kCpu && allocator->device() == Device::kCpu) {
    std::memcpy(t->view_.data, view_.data, nbytes());
    return t;
  }
  // Ordered after the legacy stream's work (the allocation included).
  if (absl::Status s = CudaStatus(cudaMemcpy(t->view_.data, view_.data, nbytes(), cudaMemcpyDefault),
                                  "tensor copy");
      !s.ok()) {
    return s;
  }
  return t;
}

absl::Status Tensor::SetZero() {
  if (allocator_ == nullptr) return absl::OkStatus();
  return allocator_->Zero(view_.data, nbytes());
}

absl::StatusOr<JaggedTensor> JaggedTensor::FromLengths(DType dtype,
                                                       const std::vector<int64_t>& lengths,
                                                       Shape inner) {
  JaggedTensor j;
  absl::StatusOr<Tensor> offsets =
      Tensor::Empty(DType::kInt64, {static_cast<int64_t>(lengths.size()) + 1});
  if (!offsets.ok()) return offsets.status();
  int64_t* o = offsets->data<int64_t>();
  o[0] = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("jagged length ", b, " must be >= 0, got ", lengths[b]));
    }
    o[b + 1] = o[b] + lengths[b];
  }
  Shape shape = {o[lengths.size()]};
  shape.insert(shape.end(), inner.begin(), inner.end());
  absl::StatusOr<Tensor> values = Tensor::Zeros(dtype, std::move(shape));
  if (!values.ok()) return values.status();
  j.values_ = *std::move(values);
  j.offsets_ = *std::move(offsets);
  return j;
}

JaggedView JaggedTensor::view() const {
  JaggedView v;
  v.values = values_.view();
  v.offsets = offsets_.view();
  return v;
}

void* ComputeStream() { return compute_stream; }

ScopedComputeStream::ScopedComputeStream(void* stream) : previous_(compute_stream) {
  compute_stream = stream;
}

ScopedComputeStream::~ScopedComputeStream() { compute_stream = previous_; }

}  // namespace recfleet::engine
