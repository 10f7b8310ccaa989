#ifndef RECFLEET_KERNELS_BASE_CUDA_STATUS_H_
#define RECFLEET_KERNELS_BASE_CUDA_STATUS_H_

// Turns CUDA runtime results into absl::Status for the launchers (plain
// C++; the kernels themselves return cudaError_t).

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recfleet {

// OK for cudaSuccess, else Internal naming `what` and the CUDA error text.
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_CUDA_STATUS_H_
