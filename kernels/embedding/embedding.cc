#include "kernels/embedding/embedding.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/embedding/embedding_internal.h"

namespace recfleet {
namespace {

using embedding_internal::BackwardAdagradCpu;
using embedding_internal::BackwardAdagradCuda;
using embedding_internal::ForwardCpu;
using embedding_internal::ForwardCuda;

// Validates the parts every call shares: the table, the ids and, for pooled
// calls, the offsets. `rows_out` is the tensor whose first dimension is the
// number of lookups (out or grad_out).
absl::Status CheckLookup(const TensorView& table, const TensorView& ids, const TensorView* offsets,
                         const TensorView& rows_out, absl::string_view rows_name) {
  const Device device = table.device;
  RECFLEET_RETURN_IF_ERROR(CheckRank(table, "table", 2));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(table, "table"));
  RECFLEET_RETURN_IF_ERROR(CheckDevice(ids, "ids", device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(ids, "ids", {DType::kInt32, DType::kInt64}));
  RECFLEET_RETURN_IF_ERROR(CheckRank(ids, "ids", 1));
  RECFLEET_RETURN_IF_ERROR(CheckDevice(rows_out, rows_name, device));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(rows_out, rows_name));
  RECFLEET_RETURN_IF_ERROR(CheckRank(rows_out, rows_name, 2));
  RECFLEET_RETURN_IF_ERROR(CheckDim(rows_out, rows_name, 1, table.dim(1)));
  if (offsets == nullptr) {
    return CheckDim(rows_out, rows_name, 0, ids.dim(0));
  }
  if (device == Device::kCpu) {
    JaggedView j{ids, *offsets};
    RECFLEET_RETURN_IF_ERROR(CheckJagged(j, "ids"));
  } else {
    RECFLEET_RETURN_IF_ERROR(CheckDevice(*offsets, "ids.offsets", device));
    RECFLEET_RETURN_IF_ERROR(CheckDType(*offsets, "ids.offsets", {DType::kInt32, DType::kInt64}));
    RECFLEET_RETURN_IF_ERROR(CheckRank(*offsets, "ids.offsets", 1));
    if (offsets->dim(0) < 1) {
      return absl::InvalidArgumentError("ids.offsets must hold batch_size + 1 >= 1 entries, got 0");
    }
  }
  return CheckDim(rows_out, rows_name, 0, offsets->dim(0) - 1);
}

absl::Status CheckMomentum(const TensorView& table, const TensorView& momentum) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(momentum, "momentum", table.device));
  if (table.device == Device::kCpu) {
    RECFLEET_RETURN_IF_ERROR(CheckDType(momentum, "momentum", {DType::kFloat32, DType::kFloat64}));
  } else {
    RECFLEET_RETURN_IF_ERROR(CheckDType(momentum, "momentum", {DType::kFloat32}));
  }
  RECFLEET_RETURN_IF_ERROR(CheckRank(momentum, "momentum", 1));
  return CheckDim(momentum, "momentum", 0, table.dim(0));
}

absl::Status CheckConfig(const RowwiseAdagradConfig& config) {
  if (!(config.learning_rate >= 0) || !(config.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rowwise Adagrad needs learning_rate >= 0 and eps > 0, got learning_rate=",
        config.learning_rate, " eps=", config.eps));
  }
  return absl::OkStatus();
}

absl::Status Forward(const TensorView& table, const TensorView& ids, const TensorView* offsets,
                     Pooling pooling, const TensorView& out, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckLookup(table, ids, offsets, out, "out"));
  const TensorView none;
  const TensorView& off = offsets ? *offsets : none;
  if (table.device == Device::kCpu) return ForwardCpu(table, ids, off, pooling, out);
  return ForwardCuda(table, ids, off, pooling, out, stream);
}

absl::Status Backward(const TensorView& grad_out, const TensorView& ids, const TensorView* offsets,
                      Pooling pooling, const RowwiseAdagradConfig& config, const TensorView& table,
                      const TensorView& momentum, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckLookup(table, ids, offsets, grad_out, "grad_out"));
  RECFLEET_RETURN_IF_ERROR(CheckMomentum(table, momentum));
  RECFLEET_RETURN_IF_ERROR(CheckConfig(config));
  const TensorView none;
  const TensorView& off = offsets ? *offsets : none;
  if (table.device == Device::kCpu) {
    return BackwardAdagradCpu(grad_out, ids, off, pooling, config, table, momentum);
  }
  return BackwardAdagradCuda(grad_out, ids, off, pooling, config, table, momentum, stream);
}

}  // namespace

absl::Status EmbeddingBagForward(const TensorView& table, const JaggedView& ids, Pooling pooling,
                                 const TensorView& out, void* stream) {
  return Forward(table, ids.values, &ids.offsets, pooling, out, stream);
}

absl::Status EmbeddingSequenceForward(const TensorView& table, const TensorView& ids,
                                      const TensorView& out, void* stream) {
  return Forward(table, ids, nullptr, Pooling::kSum, out, stream);
}

absl::Status EmbeddingBagBackwardAdagrad(const TensorView& grad_out, const JaggedView& ids,
                                         Pooling pooling, const RowwiseAdagradConfig& config,
                                         const TensorView& table, const TensorView& momentum,
                                         void* stream) {
  return Backward(grad_out, ids.values, &ids.offsets, pooling, config, table, momentum, stream);
}

absl::Status EmbeddingSequenceBackwardAdagrad(const TensorView& grad_out, const TensorView& ids,
                                              const RowwiseAdagradConfig& config,
                                              const TensorView& table, const TensorView& momentum,
                                              void* stream) {
  return Backward(grad_out, ids, nullptr, Pooling::kSum, config, table, momentum, stream);
}

}  // namespace recfleet
