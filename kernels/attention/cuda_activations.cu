// The GDPA activations evaluated on arrays exactly as the attention kernels
// compute them, so that tests can hold them to the accuracy attention.h
// documents (the end-to-end tests' bf16 tolerance would hide a wrong
// coefficient).

#include <algorithm>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

template <int A>
__global__ void ActivationKernel(const float* x, float* y_forward, float* y_backward, float* dy,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y_forward[i] = Act<A>(x[i]);
    ActAndGrad<A>(x[i], y_backward[i], dy[i]);
  }
}

}  // namespace

int LaunchActivation(int activation, const float* x, float* y_forward, float* y_backward,
                     float* dy, int64_t n, void* stream) {
  if (n == 0) return 0;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 16));
  auto s = static_cast<cudaStream_t>(stream);
  if (activation == kActGelu) {
    ActivationKernel<kActGelu><<<blocks, 256, 0, s>>>(x, y_forward, y_backward, dy, n);
  } else if (activation == kActSilu) {
    ActivationKernel<kActSilu><<<blocks, 256, 0, s>>>(x, y_forward, y_backward, dy, n);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace recfleet::attention::cuda_impl
