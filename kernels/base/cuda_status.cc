#include "kernels/base/cuda_status.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace recfleet {

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::Status CreateSideStream(absl::string_view what, cudaStream_t* stream,
                              std::initializer_list<cudaEvent_t*> events) {
  cudaStream_t s = nullptr;
  std::vector<cudaEvent_t> created;
  absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), absl::StrCat(what, " stream"));
  for (size_t i = 0; st.ok() && i < events.size(); ++i) {
    cudaEvent_t e = nullptr;
    st = CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), absl::StrCat(what, " event"));
    if (st.ok()) created.push_back(e);
  }
  if (!st.ok()) {
    for (cudaEvent_t e : created) cudaEventDestroy(e);
    if (s != nullptr) cudaStreamDestroy(s);
    return st;
  }
  *stream = s;
  size_t i = 0;
  for (cudaEvent_t* event : events) *event = created[i++];
  return absl::OkStatus();
}

}  // namespace recfleet
