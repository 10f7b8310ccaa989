#include "engine/layers/parameters.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "kernels/ops/grad_clip.h"
#include "common/status_macros.h"

namespace recfleet::engine::layers {
namespace {

template <typename T>
void Fill(Tensor& t, std::mt19937_64& rng, const ParameterInit& init) {
  // One distribution per parameter: its cached second draw never leaks into
  // the next parameter.
  std::normal_distribution<double> normal(0.0, init.stddev);
  T* v = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = static_cast<T>(init.stddev > 0 ? normal(rng) : init.constant);
  }
}

}  // namespace

ParameterRegistry::ParameterRegistry(DType dtype, uint64_t seed, Allocator* allocator)
    : dtype_(dtype), allocator_(allocator), rng_(seed) {}

void ParameterRegistry::Register(Parameter* p, const std::string& name, Shape shape,
                                 ParameterInit init) {
  p->name = name;
  p->value = Tensor::HostZeros(dtype_, shape);
  p->grad = Tensor::HostZeros(dtype_, shape);
  p->m = Tensor::HostZeros(dtype_, shape);
  p->v = Tensor::HostZeros(dtype_, shape);
  if (dtype_ == DType::kFloat64) {
    Fill<double>(p->value, rng_, init);
  } else {
    Fill<float>(p->value, rng_, init);
  }
  if (allocator_->device() != Device::kCpu) {
    absl::StatusOr<Tensor> value = p->value.CopyTo(allocator_);
    absl::StatusOr<Tensor> grad = Tensor::Zeros(dtype_, shape, allocator_);
    absl::StatusOr<Tensor> m = Tensor::Zeros(dtype_, shape, allocator_);
    absl::StatusOr<Tensor> v = Tensor::Zeros(dtype_, shape, allocator_);
    if (!value.ok() || !grad.ok() || !m.ok() || !v.ok()) std::abort();
    p->value = *std::move(value);
    p->grad = *std::move(grad);
    p->m = *std::move(m);
    p->v = *std::move(v);
  }
  if (!by_name_.emplace(name, p).second) std::abort();  // Two layers chose one name.
  params_.push_back(p);
  multi_.reset();
  bf16_current_ = false;
}

void ParameterRegistry::AddBf16Copy(Parameter* p) {
  if (allocator_->device() != Device::kCuda || dtype_ != DType::kFloat32 || !p->bf16.empty()) {
    return;
  }
  absl::StatusOr<Tensor> copy = Tensor::Empty(DType::kBFloat16, p->value.shape(), allocator_);
  if (!copy.ok()) std::abort();  // As Register's allocations.
  p->bf16 = *std::move(copy);
  multi_.reset();
  bf16_current_ = false;
}

void ParameterRegistry::OverwriteGradientFirst(Parameter* p) {
  if (allocator_->device() != Device::kCuda || p->overwrite_first) return;
  p->overwrite_first = true;
  multi_.reset();
}

void ParameterRegistry::set_overwrite_first(bool on) {
  if (on == overwrite_first_) return;
  overwrite_first_ = on;
  multi_.reset();
}

absl::Status ParameterRegistry::Prepare() {
  if (multi_ != nullptr) return absl::OkStatus();
  std::vector<AdamTensors> tensors, zeroed;
  for (Parameter* p : params_) {
    tensors.push_back({p->value.view(), p->grad.view(), p->m.view(), p->v.view(),
                       p->bf16.empty() ? TensorView() : p->bf16.view()});
    if (!(overwrite_first_ && p->overwrite_first)) zeroed.push_back(tensors.back());
  }
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> multi = MultiTensorAdam::Create(tensors);
  if (!multi.ok()) return multi.status();
  zero_multi_.reset();
  if (zeroed.size() != tensors.size()) {
    absl::StatusOr<std::unique_ptr<MultiTensorAdam>> zero = MultiTensorAdam::Create(zeroed);
    if (!zero.ok()) return zero.status();
    zero_multi_ = *std::move(zero);
  }
  multi_ = *std::move(multi);
  return absl::OkStatus();
}

absl::Status ParameterRegistry::RefreshBf16Copies() {
  if (allocator_->device() != Device::kCuda) return absl::OkStatus();
  RECFLEET_RETURN_IF_ERROR(Prepare());
  RECFLEET_RETURN_IF_ERROR(multi_->WriteBf16Copies());
  bf16_current_ = multi_->has_bf16_copies();
  return absl::OkStatus();
}

Parameter* ParameterRegistry::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

int64_t ParameterRegistry::num_elements() const {
  int64_t n = 0;
  for (const Parameter* p : params_) n += p->value.numel();
  return n;
}

absl::Status ParameterRegistry::ZeroGradients() {
  if (allocator_->device() == Device::kCuda) {
    RECFLEET_RETURN_IF_ERROR(Prepare());
    if (zero_multi_ == nullptr) return multi_->ZeroGradients();
    for (Parameter* p : params_) {
      if (p->overwrite_first) p->grad_pending = true;
    }
    any_pending_ = true;
    return zero_multi_->ZeroGradients();
  }
  for (Parameter* p : params_) RECFLEET_RETURN_IF_ERROR(p->grad.SetZero());
  return absl::OkStatus();
}

absl::Status ParameterRegistry::SettleGradients() {
  if (!any_pending_) return absl::OkStatus();
  RECFLEET_RETURN_IF_ERROR(SettleGradients(0, params_.size()));
  any_pending_ = false;
  return absl::OkStatus();
}

absl::Status ParameterRegistry::SettleGradients(size_t begin, size_t end) {
  if (!any_pending_) return absl::OkStatus();
  for (size_t k = begin; k < std::min(end, params_.size()); ++k) {
    Parameter* p = params_[k];
    if (!p->grad_pending) continue;
    p->grad_pending = false;
    RECFLEET_RETURN_IF_ERROR(p->grad.SetZero());
  }
  return absl::OkStatus();
}

absl::Status ParameterRegistry::ScaleGradients(double weight) {
  RECFLEET_RETURN_IF_ERROR(SettleGradients());
  for (Parameter* p : params_) RECFLEET_RETURN_IF_ERROR(ops::Scale(p->grad.view(), weight));
  return absl::OkStatus();
}

absl::Status ParameterRegistry::CheckSameLayout(const ParameterRegistry& other,
                                                const char* what) const {
  if (other.params_.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the other model has a different architecture (",
                     other.params_.size(), " parameters, this one ", params_.size(), ")"));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (other.params_[k]->value.shape() != params_[k]->value.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": parameter ", params_[k]->name,
                                                     " has another shape in the other model"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterRegistry::AddGradients(const ParameterRegistry& other, double weight) {
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(other, "AddGradients"));
  if (other.any_pending_) {
    return absl::FailedPreconditionError("AddGradients: the other registry's gradients are not settled");
  }
  RECFLEET_RETURN_IF_ERROR(SettleGradients());
  for (size_t k = 0; k < params_.size(); ++k) {
    RECFLEET_RETURN_IF_ERROR(
        ops::AddScaled(other.params_[k]->grad.view(), weight, params_[k]->grad.view()));
  }
  return absl::OkStatus();
}

absl::Status ParameterRegistry::CopyValuesFrom(const ParameterRegistry& other) {
  RECFLEET_RETURN_IF_ERROR(CheckSameLayout(other, "CopyParametersFrom"));
  bf16_current_ = false;
  for (size_t k = 0; k < params_.size(); ++k) {
    RECFLEET_RETURN_IF_ERROR(ops::Copy(other.params_[k]->value.view(), params_[k]->value.view()));
  }
  return absl::OkStatus();
}

absl::Status ParameterRegistry::AdamStep(const AdamConfig& config, int64_t step, double clip_norm,
                                         bool write_bf16_copies) {
  bf16_current_ = false;
  RECFLEET_RETURN_IF_ERROR(Prepare());
  RECFLEET_RETURN_IF_ERROR(SettleGradients());
  const bool fused = write_bf16_copies && allocator_->device() == Device::kCuda &&
                     multi_->has_bf16_copies();
  auto step_with = [&](const AdamConfig& c) -> absl::Status {
    if (!fused) return multi_->Step(c, step);
    RECFLEET_RETURN_IF_ERROR(multi_->StepWritingBf16Copies(c, step));
    bf16_current_ = true;
    return absl::OkStatus();
  };
  if (!(clip_norm > 0)) return step_with(config);
  if (clip_.empty()) {
    absl::StatusOr<Tensor> clip = Tensor::Zeros(dtype_, {2}, allocator_);
    if (!clip.ok()) return clip.status();
    clip_ = *std::move(clip);
  }
  const size_t bytes = DTypeSize(dtype_);
  const TensorView sum = MakeView(clip_.view().data, dtype_, {1}, allocator_->device());
  const TensorView scale =
      MakeView(static_cast<char*>(clip_.view().data) + bytes, dtype_, {1}, allocator_->device());
  RECFLEET_RETURN_IF_ERROR(multi_->GradSquaredNorm(sum, /*accumulate=*/false));
  RECFLEET_RETURN_IF_ERROR(GradClipScale(sum, clip_norm, scale));
  AdamConfig clipped = config;
  clipped.grad_scale = scale;
  return step_with(clipped);
}

}  // namespace recfleet::engine::layers
