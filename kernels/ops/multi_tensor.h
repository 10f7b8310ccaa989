#ifndef RECFLEET_KERNELS_OPS_MULTI_TENSOR_H_
#define RECFLEET_KERNELS_OPS_MULTI_TENSOR_H_

// The dense optimizer over a fixed list of parameters in one launch per
// pass: AdamW on every (param, grad, m, v), zeroing every grad, and bf16
// copies of every param that has one (alone, or written by the AdamW pass).
// Per parameter these are exactly AdamStep (adam.h), a memset and a
// round-to-nearest-even conversion; the point is the count: a model of ~60
// parameters otherwise issues ~60 launches for each, and on a small-batch
// step the host's issue time, not the GPU, sets the pace.
//
// On CUDA the list lives in a device table (multi_tensor_layout.h) uploaded
// once, stream-ordered, when the object is made: the tensors' memory must
// stay where it is for the object's lifetime. On the CPU each pass loops
// over the list (the reference). Not thread-safe.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/multi_tensor_layout.h"
#include "kernels/tensor.h"

namespace recfleet {

struct AdamTensors {
  TensorView param, grad, m, v;
  // Optional (data == nullptr: none): a bf16 tensor of param's shape that
  // WriteBf16Copies fills with param rounded to bf16.
  TensorView bf16;
};

class MultiTensorAdam {
 public:
  // Every entry: param fp32 or fp64 (fp32 on CUDA), grad/m/v of its layout,
  // bf16 (when given) bf16 of its shape on its device; all on one device.
  // InvalidArgument otherwise. `stream`: where the table's upload goes.
  static absl::StatusOr<std::unique_ptr<MultiTensorAdam>> Create(std::vector<AdamTensors> tensors,
                                                                 void* stream = nullptr);
  ~MultiTensorAdam();
  MultiTensorAdam(const MultiTensorAdam&) = delete;
  MultiTensorAdam& operator=(const MultiTensorAdam&) = delete;

  // AdamStep(config, step, ...) on every entry; the same validation.
  absl::Status Step(const AdamConfig& config, int64_t step, void* stream = nullptr) const;
  // Step, then WriteBf16Copies, in one pass on CUDA (the copies' bits
  // equal; param is not read a second time).
  absl::Status StepWritingBf16Copies(const AdamConfig& config, int64_t step,
                                     void* stream = nullptr) const;
  absl::Status ZeroGradients(void* stream = nullptr) const;
  // bf16 = round(param) for every entry with a bf16 copy.
  absl::Status WriteBf16Copies(void* stream = nullptr) const;
  // sum[0] = (accumulate: sum[0] +) the sum of grad^2 over every entry: the
  // square of the global norm that gradient clipping takes (grad_clip.h).
  // `sum`: one element of the params' dtype on their device. Deterministic:
  // CUDA adds fp32 sums of fixed chunks in a fixed order in fp64 (two
  // launches, no host wait); the CPU adds in fp64.
  absl::Status GradSquaredNorm(const TensorView& sum, bool accumulate,
                               void* stream = nullptr) const;

  size_t size() const { return tensors_.size(); }
  bool has_bf16_copies() const { return has_bf16_; }
  // CUDA: launches per pass (1, or 0 for a list without elements).
  int64_t num_chunks() const { return chunks_; }

 private:
  MultiTensorAdam() = default;

  std::vector<AdamTensors> tensors_;
  Device device_ = Device::kCpu;
  bool has_bf16_ = false;
  // CUDA: the packed table, its host copy (kept until the upload is surely
  // done: the object's end), the chunk count and one fp32 per chunk for
  // GradSquaredNorm's partial sums.
  std::vector<MultiTensorEntry> host_table_;
  MultiTensorEntry* device_table_ = nullptr;
  float* partials_ = nullptr;
  int64_t chunks_ = 0;
};

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_MULTI_TENSOR_H_
