#include "engine/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

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
    return p;
  }
  void Deallocate(void* ptr, size_t) override { ::operator delete(ptr, kAlignment); }
  absl::Status Zero(void* ptr, size_t bytes) override {
    std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

Allocator* CpuAllocator() {
  static HostAllocator* allocator = new HostAllocator();
  return allocator;
}

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
  if (device() != Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat("Clone of ", view_.DebugString(),
                                                 ": only host tensors can be cloned"));
  }
  absl::StatusOr<Tensor> t = Empty(dtype(), shape(), allocator_ ? allocator_ : CpuAllocator());
  if (!t.ok()) return t.status();
  if (nbytes() > 0) std::memcpy(t->view_.data, view_.data, nbytes());
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

}  // namespace recfleet::engine
