#ifndef RECFLEET_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
#define RECFLEET_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_

// Device implementations behind embedding.h. Arguments are already
// validated by the dispatcher. A sequence lookup is a pooled lookup with
// bags of one id each, expressed by `offsets.data == nullptr`.

#include "absl/status/status.h"
#include "kernels/embedding/embedding.h"
#include "kernels/tensor.h"

namespace recfleet::embedding_internal {

absl::Status ForwardCpu(const TensorView& table, const TensorView& ids, const TensorView& offsets,
                        Pooling pooling, const TensorView& out);
absl::Status BackwardAdagradCpu(const TensorView& grad_out, const TensorView& ids,
                                const TensorView& offsets, Pooling pooling,
                                const RowwiseAdagradConfig& config, const TensorView& table,
                                const TensorView& momentum);

absl::Status ForwardCuda(const TensorView& table, const TensorView& ids, const TensorView& offsets,
                         Pooling pooling, const TensorView& out, void* stream);
absl::Status BackwardAdagradCuda(const TensorView& grad_out, const TensorView& ids,
                                 const TensorView& offsets, Pooling pooling,
                                 const RowwiseAdagradConfig& config, const TensorView& table,
                                 const TensorView& momentum, void* stream);

}  // namespace recfleet::embedding_internal

#endif  // RECFLEET_KERNELS_EMBEDDING_EMBEDDING_INTERNAL_H_
