#include "kernels/base/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace recfleet {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace recfleet
