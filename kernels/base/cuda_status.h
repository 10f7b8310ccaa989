#ifndef RECFLEET_KERNELS_BASE_CUDA_STATUS_H_
#define RECFLEET_KERNELS_BASE_CUDA_STATUS_H_

// Turns CUDA runtime results into absl::Status for the launchers (plain
// C++; the kernels themselves return cudaError_t).

#include <cuda_runtime_api.h>

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recfleet {

// OK for cudaSuccess, else Internal naming `what` and the CUDA error text.
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

// A non-blocking stream and, for each of `events`, an event without timing
// (the pair a side stream needs to order itself with another one). All or
// nothing: on an error what was created is destroyed and the outputs are
// left untouched, so a later call can try again.
absl::Status CreateSideStream(absl::string_view what, cudaStream_t* stream,
                              std::initializer_list<cudaEvent_t*> events);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_CUDA_STATUS_H_
