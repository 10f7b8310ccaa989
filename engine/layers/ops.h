#ifndef RECFLEET_ENGINE_LAYERS_OPS_H_
#define RECFLEET_ENGINE_LAYERS_OPS_H_

// The glue between the model's layers: elementwise arithmetic, moving
// blocks of columns between activations, the expert gate's softmax and
// mixture, and the pooling scale of externally looked-up embedding bags.
// Everything the layers compute that is not a kernel-API call
// (kernels/: linear, norm, attention, embedding, activation, BCE, Adam) is
// one of these functions, so a CUDA version slots in here, call for call.
//
// Same conventions as the kernel API: views in, absl::Status out, outputs
// caller-allocated and fully written (or added to where the name says
// Add/Accumulate), InvalidArgument naming the argument on a shape or dtype
// mismatch. Dense operands are all of one dtype and on one device: fp32 or
// fp64 on the CPU (arithmetic in the operands' dtype, in a fixed order, so
// results are deterministic), fp32 on CUDA (ops_cuda.cu: asynchronous on the
// legacy default stream, the engine's compute stream; deterministic too).
// Offsets are int64 on the values' device (host offsets are validated in
// full, device offsets for shape only).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/embedding/embedding.h"
#include "kernels/tensor.h"

namespace recfleet::engine::ops {

// ---- elementwise (operands of equal numel; `out`/`acc` may alias an input)
// out = a + b. On CUDA, also with any of a, b, out in bf16 (the rest fp32):
// the sum is taken in fp32 and rounded once to out's dtype.
absl::Status Add(const TensorView& a, const TensorView& b, const TensorView& out);
// out = a * b.
absl::Status Mul(const TensorView& a, const TensorView& b, const TensorView& out);
// acc += a * b.
absl::Status AddMul(const TensorView& a, const TensorView& b, const TensorView& acc);
// out = a * b + c.
absl::Status MulAdd(const TensorView& a, const TensorView& b, const TensorView& c,
                    const TensorView& out);
// x *= weight (weight rounded to x's dtype first).
absl::Status Scale(const TensorView& x, double weight);
// acc += weight * x (weight rounded to the dtype first).
absl::Status AddScaled(const TensorView& x, double weight, const TensorView& acc);
absl::Status Copy(const TensorView& src, const TensorView& dst);
// x = 0 (also for a bf16 tensor on CUDA).
absl::Status Zero(const TensorView& x);
// x[i] = 1 / numel(x), divided in x's dtype: the per-element weights of a
// mean over x.
absl::Status FillMeanWeights(const TensorView& x);

// ---- column blocks of row-major [rows, width] activations
// dst[r, col + j] = src[r, j] for j < src width (dst [rows, W], src [rows, w]).
absl::Status ScatterColumns(const TensorView& src, int64_t col, const TensorView& dst);
// dst[r, j] = src[r, col + j] (src [rows, W], dst [rows, w]).
absl::Status GatherColumns(const TensorView& src, int64_t col, const TensorView& dst);
// out [times * n] = x [n] repeated `times` times (x's numel n).
absl::Status RepeatRows(const TensorView& x, int64_t times, const TensorView& out);
// The backward of RepeatRows: dx [n] += the sum of the `times` blocks of dy,
// block 0 first.
absl::Status AccumulateRepeats(const TensorView& dy, const TensorView& dx);

// ---- the expert gate
// Row-wise softmax of x [rows, cols] into y (max-subtracted).
absl::Status SoftmaxRows(const TensorView& x, const TensorView& y);
// dx = y * (dy - sum_j y_j dy_j) per row, y the forward output.
absl::Status SoftmaxRowsBackward(const TensorView& y, const TensorView& dy, const TensorView& dx);
// acc [rows, n] += gate[:, column] * x, gate [rows, cols], x [rows, n]: adds
// one expert's output weighted by its gate probability.
absl::Status AddGated(const TensorView& gate, int64_t column, const TensorView& x,
                      const TensorView& acc);
// The backward of AddGated given dacc: dx = gate[:, column] * dacc, and
// dgate[:, column] = the row-wise dot of dacc and x (other columns untouched).
absl::Status AddGatedBackward(const TensorView& gate, int64_t column, const TensorView& x,
                              const TensorView& dacc, const TensorView& dx,
                              const TensorView& dgate);

// ---- embedding bags
// out[b] = sums[b] / length(b) for mean pooling (and for bags of length > 0),
// else sums[b]: turns a bag's row sum into its pooled value, and the pooled
// value's gradient into the row sum's. sums, out [bags, dim]; offsets
// [bags + 1] int64 on their device (the bag lengths).
absl::Status ScaleBags(const TensorView& sums, const TensorView& offsets, Pooling pooling,
                       const TensorView& out);
// out [offsets[bags], dim]: for every id of bag b, the gradient of its table
// row, dpooled[b] (divided by the bag length for mean pooling).
absl::Status ExpandBags(const TensorView& dpooled, const TensorView& offsets, Pooling pooling,
                        const TensorView& out);

// ---- precision
// dst = src converted between fp32 and bf16 (either direction, equal numel,
// one device; rounding to nearest even).
absl::Status Convert(const TensorView& src, const TensorView& dst);

// ---- sparse gradients
// out[slots[i]] += rows[i] for every row i: rows [n, dim], slots int64 [n]
// (values in [0, out rows), unchecked on CUDA), out [u, dim]. On CUDA the
// sums use atomics (order not fixed); on the CPU they run in row order.
absl::Status ScatterAddRows(const TensorView& rows, const TensorView& slots, const TensorView& out);

// ---- indices
// dst = src, int64 tensors of equal numel on one device.
absl::Status CopyIndices(const TensorView& src, const TensorView& dst);

// ---- host transfers
// dst[i] = src[i], converted to dst's dtype.
absl::Status CopyFromHost(absl::Span<const float> src, const TensorView& dst);
// The elements as doubles, in order.
absl::StatusOr<std::vector<double>> CopyToHost(const TensorView& x);
// The sum of x's elements accumulated in double, in order.
absl::StatusOr<double> SumToHost(const TensorView& x);

}  // namespace recfleet::engine::ops

#endif  // RECFLEET_ENGINE_LAYERS_OPS_H_
