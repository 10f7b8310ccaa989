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

// The FP8 GEMMs' cached weight from codes made elsewhere: q [rows, cols]
// (one byte each, row-major) is copied to w_q and transposed into wt_q
// [cols, rows]; the scale of 128x128 tile (i, j), tile_scales[i * tile_cols
// + j] (tile_cols = ceil(cols / 128)), goes to w_scales[i * w_stride + j]
// and wt_scales[j * wt_stride + i]. Other scale entries are not written.
cudaError_t Fp8WeightFromCodes(const uint8_t* q, const float* tile_scales, int64_t rows,
                               int64_t cols, uint8_t* w_q, float* w_scales, int64_t w_stride,
                               uint8_t* wt_q, float* wt_scales, int64_t wt_stride, void* stream);

}  // namespace recfleet::gemm_cuda

#endif  // RECFLEET_KERNELS_GEMM_GEMM_KERNELS_H_
