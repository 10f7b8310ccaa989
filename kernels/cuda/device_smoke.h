#ifndef RECFLEET_KERNELS_CUDA_DEVICE_SMOKE_H_
#define RECFLEET_KERNELS_CUDA_DEVICE_SMOKE_H_

#include <string>

namespace recfleet::cuda {

// Describes the first visible GPU ("NVIDIA H200, sm_90, 132 SMs"), or the
// CUDA error that prevented finding one. Never throws.
std::string DescribeDevice();

// Computes y[i] = a * x[i] + y[i] on the GPU for n host values. Returns an
// empty string on success, else the failing CUDA call and its error text.
std::string Saxpy(float a, const float* x, float* y, int n);

}  // namespace recfleet::cuda

#endif  // RECFLEET_KERNELS_CUDA_DEVICE_SMOKE_H_
