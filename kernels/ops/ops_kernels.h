#ifndef RECFLEET_KERNELS_OPS_OPS_KERNELS_H_
#define RECFLEET_KERNELS_OPS_OPS_KERNELS_H_

// CUDA kernels behind activation.h, bce.h and adam.h with a plain interface
// (no absl). Element dtype codes as cuda_util::ElemType (0 fp32, 1 bf16);
// device pointers; launches go to `stream` (a cudaStream_t), asynchronously.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops/multi_tensor_layout.h"

namespace recfleet::ops_cuda {

// act: 0 relu, 1 gelu (exact, erf), 2 silu. y may alias x.
cudaError_t ActivationForward(int act, const void* x, void* y, int type, int64_t n, void* stream);
// dx = dy * act'(x); dx may alias dy.
cudaError_t ActivationBackward(int act, const void* x, const void* dy, void* dx, int type,
                               int64_t n, void* stream);

// fp32: loss[i] = BCE(sigmoid(z[i]), y[i]); dz[i] = dloss[i] * (sigmoid(z[i]) - y[i]).
cudaError_t BceForward(const float* z, const float* y, float* loss, int64_t n, void* stream);
cudaError_t BceBackward(const float* z, const float* y, const float* dloss, float* dz, int64_t n,
                        void* stream);

// One Adam(W) step on fp32 tensors; the scalars are precomputed on the host
// exactly as the CPU reference does (kernels/ops/adam.cc).
// grad_scale: a device scalar every gradient element is multiplied by
// first; null: 1.
struct AdamScalars {
  float beta1, beta2, step_size, inv_sqrt_bc2, eps, decay, weight_decay;
  bool decoupled;
  const float* grad_scale;
};
cudaError_t AdamStep(const AdamScalars& s, float* p, const float* g, float* m, float* v,
                     int64_t n, void* stream);

// Over a device table packed by AssignChunks (`count` entries, `chunks`
// chunks), one launch each: AdamStep on every entry (the same per-element
// arithmetic as AdamStep above), grad = 0 for every entry, bf16 = param
// (round to nearest even) for every entry with a bf16 copy.
cudaError_t MultiTensorAdamStep(const AdamScalars& s, const MultiTensorEntry* table, int count,
                                int64_t chunks, void* stream);
// MultiTensorAdamStep that also writes bf16 = the new param (the
// MultiTensorBf16Copy bits) for every entry with a bf16 copy: one pass.
cudaError_t MultiTensorAdamStepBf16(const AdamScalars& s, const MultiTensorEntry* table, int count,
                                    int64_t chunks, void* stream);
cudaError_t MultiTensorZeroGrad(const MultiTensorEntry* table, int count, int64_t chunks,
                                void* stream);
cudaError_t MultiTensorBf16Copy(const MultiTensorEntry* table, int count, int64_t chunks,
                                void* stream);

// Global-norm clipping (grad_clip.h), deterministic: partials[c] = the sum of
// grad^2 over chunk c of the table (fp32 within a chunk); then one block adds
// the `chunks` partials in a fixed order in fp64 and writes (accumulate:
// adds) the total to *sum.
cudaError_t MultiTensorGradSquaredSum(const MultiTensorEntry* table, int count, int64_t chunks,
                                      float* partials, float* sum, bool accumulate, void* stream);
// *scale = min(1, max_norm / (sqrt(total) + 1e-6)), NaN when that ratio is
// NaN, total = sum[0] + ... + sum[parts - 1] (fp64 arithmetic in order, as
// the CPU reference).
cudaError_t GradClipScale(const float* sum, int64_t parts, double max_norm, float* scale,
                          void* stream);

}  // namespace recfleet::ops_cuda

#endif  // RECFLEET_KERNELS_OPS_OPS_KERNELS_H_
