#ifndef RECFLEET_KERNELS_NORM_NORM_KERNELS_H_
#define RECFLEET_KERNELS_NORM_NORM_KERNELS_H_

// CUDA kernels behind norm.h with a plain interface (no absl). Element
// dtype codes: 0 fp32, 1 bf16 (cuda_util::ElemType); device pointers;
// launches go to `stream` (a cudaStream_t).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::norm_cuda {

struct Shape {
  int64_t rows = 0, dim = 0;
  bool layer_norm = false;
};

// y_fp8_format: 0 = y has dtype code y_type; 1 = E4M3, 2 = E5M2 with
// y_scales [rows, ceil(dim/128)].
cudaError_t Forward(const Shape& s, const void* x, int x_type, const void* gamma, int gamma_type,
                    const void* beta, int beta_type, float eps, void* y, int y_type,
                    int y_fp8_format, float* y_scales, float* mean, float* rstd, void* stream);

// dgamma/dbeta (fp32) are overwritten; dbeta may be null (RMSNorm).
cudaError_t Backward(const Shape& s, const void* dy, int dy_type, const void* x, int x_type,
                     const void* gamma, int gamma_type, const float* mean, const float* rstd,
                     void* dx, int dx_type, float* dgamma, float* dbeta, void* stream);

}  // namespace recfleet::norm_cuda

#endif  // RECFLEET_KERNELS_NORM_NORM_KERNELS_H_
