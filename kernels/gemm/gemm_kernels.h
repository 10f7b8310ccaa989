#ifndef RECFLEET_KERNELS_GEMM_GEMM_KERNELS_H_
#define RECFLEET_KERNELS_GEMM_GEMM_KERNELS_H_

// Elementwise CUDA helpers around the cuBLASLt GEMMs of linear.h, with a
// plain interface. Element codes: 0 fp32, 1 bf16. Device pointers; launches
// go to `stream` (a cudaStream_t).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::gemm_cuda {

// out[i] = bf16(in[i]) for n fp32 elements.
cudaError_t CastToBf16(const float* in, void* out, int64_t n, void* stream);

// c[i, j] += bias[j] for a row-major [m, n] matrix.
cudaError_t AddBias(void* c, int c_type, const void* bias, int bias_type, int64_t m, int64_t n,
                    void* stream);

// dbias[j] (+)= sum_i dy[i, j] for a row-major [m, n] matrix, deterministic.
cudaError_t ColumnSums(const void* dy, int dy_type, int64_t m, int64_t n, bool accumulate,
                       void* dbias, int dbias_type, void* stream);

}  // namespace recfleet::gemm_cuda

#endif  // RECFLEET_KERNELS_GEMM_GEMM_KERNELS_H_
