// CUDA side of embedding.h: maps validated views onto the kernels.

#include "kernels/base/cuda_status.h"
#include "kernels/embedding/embedding_internal.h"
#include "kernels/embedding/embedding_kernels.h"

namespace recfleet::embedding_internal {
namespace {

embedding_cuda::Table TableOf(const TensorView& t) {
  embedding_cuda::Table out;
  out.data = t.data;
  out.bf16 = t.dtype == DType::kBFloat16;
  out.rows = t.dim(0);
  out.dim = t.dim(1);
  return out;
}

embedding_cuda::Lookup LookupOf(const TensorView& ids, const TensorView& offsets,
                                Pooling pooling) {
  embedding_cuda::Lookup l;
  l.ids = ids.data;
  l.ids64 = ids.dtype == DType::kInt64;
  l.num_ids = ids.numel();
  if (offsets.data != nullptr) {
    l.offsets = offsets.data;
    l.offsets64 = offsets.dtype == DType::kInt64;
    l.bags = offsets.numel() - 1;
    l.mean = pooling == Pooling::kMean;
  } else {
    l.bags = l.num_ids;
  }
  return l;
}

}  // namespace

absl::Status ForwardCuda(const TensorView& table, const TensorView& ids, const TensorView& offsets,
                         Pooling pooling, const TensorView& out, void* stream) {
  return CudaStatus(embedding_cuda::Forward(TableOf(table), LookupOf(ids, offsets, pooling),
                                            out.data, out.dtype == DType::kBFloat16, stream),
                    "embedding forward");
}

absl::Status BackwardAdagradCuda(const TensorView& grad_out, const TensorView& ids,
                                 const TensorView& offsets, Pooling pooling,
                                 const RowwiseAdagradConfig& config, const TensorView& table,
                                 const TensorView& momentum, void* stream) {
  if (ids.numel() > INT32_MAX) {
    return absl::InvalidArgumentError(
        "embedding backward handles at most 2^31 - 1 ids per call; split the batch");
  }
  return CudaStatus(
      embedding_cuda::BackwardAdagrad(TableOf(table), LookupOf(ids, offsets, pooling),
                                      grad_out.data, grad_out.dtype == DType::kBFloat16,
                                      config.learning_rate, config.eps, momentum.as<float>(),
                                      stream),
      "embedding backward (dedup + rowwise Adagrad)");
}

}  // namespace recfleet::embedding_internal
