#include "kernels/ops/multi_tensor.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "kernels/base/formats.h"
#include "kernels/ops/adam_internal.h"
#include "kernels/ops/check.h"
#include "kernels/ops/ops_kernels.h"

namespace recfleet {

absl::StatusOr<std::unique_ptr<MultiTensorAdam>> MultiTensorAdam::Create(
    std::vector<AdamTensors> tensors, void* stream) {
  std::unique_ptr<MultiTensorAdam> a(new MultiTensorAdam());
  if (!tensors.empty()) a->device_ = tensors.front().param.device;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const AdamTensors& t = tensors[k];
    const std::string what = absl::StrCat("multi-tensor Adam entry ", k);
    RECFLEET_RETURN_IF_ERROR(CheckFloat(t.param, what + " param"));
    if (t.param.device != a->device_) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": every entry must be on one device"));
    }
    RECFLEET_RETURN_IF_ERROR(CheckSameLayout(t.grad, what + " grad", t.param));
    RECFLEET_RETURN_IF_ERROR(CheckSameLayout(t.m, what + " m", t.param));
    RECFLEET_RETURN_IF_ERROR(CheckSameLayout(t.v, what + " v", t.param));
    if (t.bf16.data != nullptr) {
      if (t.bf16.dtype != DType::kBFloat16 || t.bf16.device != t.param.device ||
          t.bf16.shape != t.param.shape || t.param.dtype != DType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": the bf16 copy must be bf16 of an fp32 param's shape and device, got ",
            t.bf16.DebugString(), " for ", t.param.DebugString()));
      }
      a->has_bf16_ = true;
    }
  }
  a->tensors_ = std::move(tensors);
  if (a->device_ != Device::kCuda) return a;
  for (const AdamTensors& t : a->tensors_) {
    MultiTensorEntry e;
    e.param = t.param.as<float>();
    e.grad = t.grad.as<float>();
    e.m = t.m.as<float>();
    e.v = t.v.as<float>();
    e.bf16 = static_cast<uint16_t*>(t.bf16.data);
    e.numel = t.param.numel();
    a->host_table_.push_back(e);
  }
  a->chunks_ = AssignChunks(&a->host_table_);
  if (a->host_table_.empty()) return a;
  void* partials = nullptr;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&partials, a->chunks_ * sizeof(float)),
                                      "multi-tensor partial sums"));
  a->partials_ = static_cast<float*>(partials);
  const size_t bytes = a->host_table_.size() * sizeof(MultiTensorEntry);
  void* table = nullptr;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&table, bytes), "multi-tensor table"));
  a->device_table_ = static_cast<MultiTensorEntry*>(table);
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(table, a->host_table_.data(), bytes,
                                                      cudaMemcpyHostToDevice,
                                                      static_cast<cudaStream_t>(stream)),
                                      "multi-tensor table upload"));
  return a;
}

MultiTensorAdam::~MultiTensorAdam() {
  // cudaFree waits for the device, so no launch still reads the table.
  if (device_table_ != nullptr) cudaFree(device_table_);
  if (partials_ != nullptr) cudaFree(partials_);
}

absl::Status MultiTensorAdam::Step(const AdamConfig& config, int64_t step, void* stream) const {
  RECFLEET_RETURN_IF_ERROR(CheckAdamConfig(config, step));
  if (!tensors_.empty()) RECFLEET_RETURN_IF_ERROR(CheckGradScale(config, tensors_.front().param));
  if (device_ != Device::kCuda) {
    for (const AdamTensors& t : tensors_) {
      RECFLEET_RETURN_IF_ERROR(AdamStep(config, step, t.param, t.grad, t.m, t.v));
    }
    return absl::OkStatus();
  }
  return CudaStatus(
      ops_cuda::MultiTensorAdamStep(CudaAdamScalars(config, step), device_table_,
                                    static_cast<int>(host_table_.size()), chunks_, stream),
      "multi-tensor Adam step");
}

absl::Status MultiTensorAdam::StepWritingBf16Copies(const AdamConfig& config, int64_t step,
                                                    void* stream) const {
  if (device_ != Device::kCuda || !has_bf16_) {
    RECFLEET_RETURN_IF_ERROR(Step(config, step, stream));
    return WriteBf16Copies(stream);
  }
  RECFLEET_RETURN_IF_ERROR(CheckAdamConfig(config, step));
  RECFLEET_RETURN_IF_ERROR(CheckGradScale(config, tensors_.front().param));
  return CudaStatus(
      ops_cuda::MultiTensorAdamStepBf16(CudaAdamScalars(config, step), device_table_,
                                        static_cast<int>(host_table_.size()), chunks_, stream),
      "multi-tensor Adam step with bf16 copies");
}

absl::Status MultiTensorAdam::ZeroGradients(void* stream) const {
  if (device_ != Device::kCuda) {
    for (const AdamTensors& t : tensors_) {
      if (t.grad.numel() > 0) std::memset(t.grad.data, 0, t.grad.nbytes());
    }
    return absl::OkStatus();
  }
  return CudaStatus(ops_cuda::MultiTensorZeroGrad(device_table_,
                                                  static_cast<int>(host_table_.size()), chunks_,
                                                  stream),
                    "multi-tensor zero gradients");
}

absl::Status MultiTensorAdam::WriteBf16Copies(void* stream) const {
  if (!has_bf16_) return absl::OkStatus();
  if (device_ != Device::kCuda) {
    for (const AdamTensors& t : tensors_) {
      if (t.bf16.data == nullptr) continue;
      for (int64_t i = 0; i < t.param.numel(); ++i) {
        t.bf16.as<uint16_t>()[i] = FloatToBFloat16(t.param.as<const float>()[i]);
      }
    }
    return absl::OkStatus();
  }
  return CudaStatus(ops_cuda::MultiTensorBf16Copy(device_table_,
                                                  static_cast<int>(host_table_.size()), chunks_,
                                                  stream),
                    "multi-tensor bf16 copies");
}

absl::Status MultiTensorAdam::GradSquaredNorm(const TensorView& sum, bool accumulate,
                                              void* stream) const {
  if (sum.numel() != 1 || sum.device != device_ || sum.data == nullptr ||
      (!tensors_.empty() && sum.dtype != tensors_.front().param.dtype) ||
      (device_ == Device::kCuda && sum.dtype != DType::kFloat32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multi-tensor gradient norm: the sum must be one element of the params' dtype and device, got ",
        sum.DebugString()));
  }
  if (device_ == Device::kCuda) {
    return CudaStatus(ops_cuda::MultiTensorGradSquaredSum(device_table_,
                                                          static_cast<int>(host_table_.size()),
                                                          chunks_, partials_, sum.as<float>(),
                                                          accumulate, stream),
                      "multi-tensor gradient norm");
  }
  const bool fp64 = sum.dtype == DType::kFloat64;
  double total = 0;
  if (accumulate) total = fp64 ? sum.as<const double>()[0] : sum.as<const float>()[0];
  for (const AdamTensors& t : tensors_) {
    for (int64_t i = 0; i < t.grad.numel(); ++i) {
      const double g = fp64 ? t.grad.as<const double>()[i] : t.grad.as<const float>()[i];
      total += g * g;
    }
  }
  if (fp64) {
    sum.as<double>()[0] = total;
  } else {
    sum.as<float>()[0] = static_cast<float>(total);
  }
  return absl::OkStatus();
}

}  // namespace recfleet
