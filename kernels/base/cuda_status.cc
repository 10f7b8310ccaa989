#include "kernels/base/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace recfleet {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::Status CreateSideStream(absl::string_view what, cudaStream_t* stream,
                              std::initializer_list<cudaEvent_t*> events) {
  cudaStream_t s;
  if (absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), absl::StrCat(what, " stream"));
      !st.ok()) {
    return st;
  }
  *stream = s;
  for (cudaEvent_t* event : events) {
    cudaEvent_t e;
    if (absl::Status st = CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), absl::StrCat(what, " event"));
        !st.ok()) {
      return st;
    }
    *event = e;
  }
  return absl::OkStatus();
}

}  // namespace recfleet
