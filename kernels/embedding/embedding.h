#ifndef RECFLEET_KERNELS_EMBEDDING_EMBEDDING_H_
#define RECFLEET_KERNELS_EMBEDDING_EMBEDDING_H_

// Embedding-table lookups and their fused sparse optimizer.
//
// A table is a dense [rows, dim] tensor (fp32 or bf16 on either device; fp64
// on the CPU for exact references). Two lookups read it:
//   * pooled ("embedding bag"): a jagged batch of id lists; output row b is the
//     sum (or mean) of the table rows named by list b; an empty list gives 0;
//   * sequence: one output row per id (per-token lookup).
// Their backward passes never build a dense table gradient: they gather the
// gradient per *distinct* id (duplicates within and across lists are summed
// first) and immediately apply one step of rowwise Adagrad to exactly those
// rows, so a step touches only useful bytes.
//
// Rowwise Adagrad (one fp32 accumulator per row), for each distinct id r with
// summed gradient g_r (a dim-vector):
//     momentum[r] += mean_j(g_r[j]^2)
//     table[r]    -= learning_rate * g_r / (sqrt(momentum[r]) + eps)
// Each distinct row is updated exactly once per call, so the result does not
// depend on how ids are ordered or duplicated.
//
// Devices: every tensor of one call lives on the same Device, and the call
// dispatches on it. On kCpu, everything (including jagged offsets) is
// validated, ids are range-checked and accumulation is in double. On kCuda,
// shapes and dtypes are validated on the host but offsets and ids are device
// memory the call does not read back: offsets must be well formed and ids in
// [0, rows) (the caller's data pipeline guarantees it; out-of-range ids are
// undefined behaviour). CUDA work is enqueued on `stream` (a cudaStream_t;
// nullptr = the legacy default stream) and is asynchronous; temporary device
// memory is taken with cudaMallocAsync on that stream. Row offsets are 64-bit
// so tables beyond 2^31 elements (tens of GB) work; one backward call takes
// at most 2^31 - 1 ids (split larger batches).
//
// Thread-safety: calls are reentrant; concurrent backward calls that update
// the same table must be serialized by the caller (use one stream).

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recfleet {

enum class Pooling : uint8_t { kSum, kMean };

struct RowwiseAdagradConfig {
  float learning_rate = 0.01f;
  float eps = 1e-8f;
};

// Pooled lookup. table [rows, dim] (fp32/bf16; fp64 on CPU); ids.values
// [total] int32/int64, ids.offsets [batch + 1] int32/int64 (same device as
// the table); out [batch, dim] fp32/bf16 (fp64 on CPU), fully overwritten.
// Accumulation is fp32 on CUDA, double on CPU.
absl::Status EmbeddingBagForward(const TensorView& table, const JaggedView& ids, Pooling pooling,
                                 const TensorView& out, void* stream = nullptr);

// Per-token lookup: out[i] = table[ids[i]]. ids [n] int32/int64; out [n, dim].
absl::Status EmbeddingSequenceForward(const TensorView& table, const TensorView& ids,
                                      const TensorView& out, void* stream = nullptr);

// Backward of EmbeddingBagForward fused with rowwise Adagrad. grad_out
// [batch, dim] fp32/bf16 (fp64 on CPU) is d(loss)/d(out); `ids` and
// `pooling` must be the ones the forward used. Updates `table` [rows, dim]
// and `momentum` [rows] fp32 (fp64 on CPU) in place, only at ids present.
absl::Status EmbeddingBagBackwardAdagrad(const TensorView& grad_out, const JaggedView& ids,
                                         Pooling pooling, const RowwiseAdagradConfig& config,
                                         const TensorView& table, const TensorView& momentum,
                                         void* stream = nullptr);

// Backward of EmbeddingSequenceForward fused with rowwise Adagrad. grad_out
// [n, dim]; ids [n]. Same update rule and promises as above.
absl::Status EmbeddingSequenceBackwardAdagrad(const TensorView& grad_out, const TensorView& ids,
                                              const RowwiseAdagradConfig& config,
                                              const TensorView& table, const TensorView& momentum,
                                              void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_EMBEDDING_EMBEDDING_H_
