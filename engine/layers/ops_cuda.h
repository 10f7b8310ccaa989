#ifndef RECFLEET_ENGINE_LAYERS_OPS_CUDA_H_
#define RECFLEET_ENGINE_LAYERS_OPS_CUDA_H_

// CUDA kernels behind the glue ops (ops.h) for fp32 device tensors, with a
// plain interface (no absl): device pointers, element counts, launches on
// `stream` (a cudaStream_t), asynchronous. Semantics are the CPU versions'
// (ops.cc); offsets are device int64 arrays here.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::engine::ops_cuda {

// Elementwise, n elements. kind: 0 out = a + b, 1 out = a * b,
// 2 out += a * b (out is the accumulator), 3 out = a * b + c,
// 4 out = a * w (b, c unused), 5 out += w * a, 6 out = w.
cudaError_t Elementwise(int kind, const float* a, const float* b, const float* c, float w,
                        float* out, int64_t n, void* stream);

// out = a + b over n elements, each operand fp32 or (flag set) bf16; the
// sum is taken in fp32 and rounded once to out's type.
cudaError_t AddMixed(const void* a, bool a_bf16, const void* b, bool b_bf16, void* out,
                     bool out_bf16, int64_t n, void* stream);

// out [times * n] = x [n] repeated; dx [n] += sum over the `times` blocks of dy.
cudaError_t RepeatRows(const float* x, int64_t n, int64_t times, float* out, void* stream);
cudaError_t AccumulateRepeats(const float* dy, int64_t n, int64_t times, float* dx, void* stream);

// Row-wise softmax over [rows, cols] and its backward dx = y * (dy - <y, dy>).
cudaError_t SoftmaxRows(const float* x, float* y, int64_t rows, int64_t cols, void* stream);
cudaError_t SoftmaxRowsBackward(const float* y, const float* dy, float* dx, int64_t rows,
                                int64_t cols, void* stream);

// acc [rows, n] += gate[:, column] * x; backward: dx = gate[:, column] * dacc,
// dgate[:, column] = rowwise <dacc, x>. gate [rows, experts].
cudaError_t AddGated(const float* gate, int64_t experts, int64_t column, const float* x,
                     int64_t rows, int64_t n, float* acc, void* stream);
cudaError_t AddGatedBackward(const float* gate, int64_t experts, int64_t column, const float* x,
                             const float* dacc, int64_t rows, int64_t n, float* dx, float* dgate,
                             void* stream);

// Bags by device offsets [bags + 1]: out[b] = sums[b] * (mean ? 1/len : 1);
// ExpandBags: out[i] = dpooled[bag of i] * (mean ? 1/len : 1), ids rows.
cudaError_t ScaleBags(const float* sums, const int64_t* offsets, int64_t bags, int64_t dim,
                      bool mean, float* out, void* stream);
cudaError_t ExpandBags(const float* dpooled, const int64_t* offsets, int64_t bags, int64_t ids,
                       int64_t dim, bool mean, float* out, void* stream);

// out[slots[i], :] += rows[i, :] for i < n (fp32 atomics; out [out_rows,
// dim], every slot in [0, out_rows)). An output of at most 12,288 elements
// is summed per block in shared memory first.
cudaError_t ScatterAddRows(const float* rows, const int64_t* slots, int64_t n, int64_t dim,
                           int64_t out_rows, float* out, void* stream);

// fp32 <-> bf16 (round to nearest even), n elements.
cudaError_t ToBf16(const float* x, void* y, int64_t n, void* stream);
cudaError_t FromBf16(const void* x, float* y, int64_t n, void* stream);

}  // namespace recfleet::engine::ops_cuda

#endif  // RECFLEET_ENGINE_LAYERS_OPS_CUDA_H_
