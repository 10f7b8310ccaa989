#include "engine/layers/staged_batch.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/base/cuda_status.h"

namespace recfleet::engine::layers {
namespace {

constexpr size_t kAlign = 64;

size_t Aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t E(void* e) { return static_cast<cudaEvent_t>(e); }

// One array of the batch in the packed buffer.
struct Piece {
  const void* src;
  size_t bytes;
  size_t offset;
};

}  // namespace

StagedBatch::~StagedBatch() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(S(copy_stream_));
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (device_ != nullptr) cudaFree(device_);
  if (copied_ != nullptr) cudaEventDestroy(E(copied_));
  if (consumed_ != nullptr) cudaEventDestroy(E(consumed_));
  if (copy_stream_ != nullptr) cudaStreamDestroy(S(copy_stream_));
}

absl::Status StagedBatch::EnsureBuffers(size_t bytes) {
  if (copy_stream_ == nullptr) {
    cudaStream_t s;
    cudaEvent_t a, b;
    RECFLEET_RETURN_IF_ERROR(CreateSideStream("batch copy", &s, {&a, &b}));
    copy_stream_ = s;
    copied_ = a;
    consumed_ = b;
  }
  if (bytes <= capacity_) return absl::OkStatus();
  // Growing: nothing may still read or write the old buffers.
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(S(copy_stream_)), "batch copy"));
  if (consume_recorded_) {
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(E(consumed_)), "batch consumed"));
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (device_ != nullptr) cudaFree(device_);
  pinned_ = device_ = nullptr;
  capacity_ = 0;
  const size_t grown = bytes + bytes / 4;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&pinned_, grown), "pinned batch buffer"));
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&device_, grown), "device batch buffer"));
  capacity_ = grown;
  return absl::OkStatus();
}

absl::Status StagedBatch::Stage(const Batch& b, Device device) {
  batch_ = &b;
  ++generation_;
  const int64_t tokens = b.sequence.empty() ? 0 : b.sequence[0].offsets.back();
  std::vector<Piece> pieces;
  size_t total = 0;
  auto add = [&](const void* src, size_t bytes) {
    pieces.push_back({src, bytes, total});
    total += Aligned(bytes);
    return pieces.size() - 1;
  };
  std::vector<size_t> list_ids, list_offsets, seq_ids;
  for (const IdList& l : b.id_lists) {
    list_ids.push_back(add(l.ids.data(), l.ids.size() * sizeof(int64_t)));
    list_offsets.push_back(add(l.offsets.data(), l.offsets.size() * sizeof(int64_t)));
  }
  for (const IdList& l : b.sequence) seq_ids.push_back(add(l.ids.data(), tokens * sizeof(int64_t)));
  const size_t seq_off = b.sequence.empty()
                             ? add(nullptr, 0)
                             : add(b.sequence[0].offsets.data(),
                                   b.sequence[0].offsets.size() * sizeof(int64_t));
  const size_t dense = add(b.dense.data(), b.dense.size() * sizeof(float));
  const size_t ctr = add(b.ctr_labels.data(), b.ctr_labels.size() * sizeof(float));
  const size_t cvr = add(b.cvr_labels.data(), b.cvr_labels.size() * sizeof(float));

  char* base = nullptr;
  if (device == Device::kCuda) {
    RECFLEET_RETURN_IF_ERROR(EnsureBuffers(total));
    // The previous copy out of the pinned buffer must be done before it is
    // refilled, and the compute stream done with the device buffer before
    // it is overwritten.
    if (copy_pending_) {
      RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(E(copied_)), "batch copy"));
    }
    for (const Piece& p : pieces) {
      if (p.bytes > 0) std::memcpy(static_cast<char*>(pinned_) + p.offset, p.src, p.bytes);
    }
    if (consume_recorded_) {
      RECFLEET_RETURN_IF_ERROR(
          CudaStatus(cudaStreamWaitEvent(S(copy_stream_), E(consumed_), 0), "batch consumed"));
    }
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(device_, pinned_, total,
                                                        cudaMemcpyHostToDevice, S(copy_stream_)),
                                        "batch copy to device"));
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(E(copied_), S(copy_stream_)), "batch copy"));
    copy_pending_ = true;
    consume_recorded_ = false;
    base = static_cast<char*>(device_);
  }
  auto view = [&](size_t piece, DType dtype, int64_t n) {
    void* data = device == Device::kCuda ? base + pieces[piece].offset
                                         : const_cast<void*>(pieces[piece].src);
    return MakeView(data, dtype, {n}, device);
  };
  id_lists_.clear();
  for (size_t f = 0; f < b.id_lists.size(); ++f) {
    const IdList& l = b.id_lists[f];
    id_lists_.push_back(
        {view(list_ids[f], DType::kInt64, static_cast<int64_t>(l.ids.size())),
         view(list_offsets[f], DType::kInt64, static_cast<int64_t>(l.offsets.size()))});
  }
  sequence_ids_.clear();
  for (size_t f = 0; f < b.sequence.size(); ++f) {
    sequence_ids_.push_back(view(seq_ids[f], DType::kInt64, tokens));
  }
  sequence_offsets_ = b.sequence.empty()
                          ? TensorView()
                          : view(seq_off, DType::kInt64,
                                 static_cast<int64_t>(b.sequence[0].offsets.size()));
  dense_ = view(dense, DType::kFloat32, static_cast<int64_t>(b.dense.size()));
  if (b.size > 0 && !b.dense.empty()) {
    dense_.shape = {b.size, static_cast<int64_t>(b.dense.size()) / b.size};
  }
  labels_[0] = view(ctr, DType::kFloat32, static_cast<int64_t>(b.ctr_labels.size()));
  labels_[1] = view(cvr, DType::kFloat32, static_cast<int64_t>(b.cvr_labels.size()));
  return absl::OkStatus();
}

absl::Status StagedBatch::WaitReady(void* compute_stream) {
  if (!copy_pending_) return absl::OkStatus();
  return CudaStatus(cudaStreamWaitEvent(S(compute_stream), E(copied_), 0), "batch copy wait");
}

absl::Status StagedBatch::MarkConsumed(void* compute_stream) {
  if (consumed_ == nullptr) return absl::OkStatus();
  consume_recorded_ = true;
  return CudaStatus(cudaEventRecord(E(consumed_), S(compute_stream)), "batch consumed");
}

DeferredMean::~DeferredMean() {
  if (done_ != nullptr) {
    cudaEventSynchronize(E(done_));
    cudaEventDestroy(E(done_));
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

absl::Status DeferredMean::Enqueue(const TensorView& values) {
  if (values.dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeferredMean: values must be fp32, got ", values.DebugString()));
  }
  n_ = values.numel();
  on_device_ = values.device == Device::kCuda;
  enqueued_ = true;
  if (!on_device_) {
    double sum = 0;
    for (int64_t i = 0; i < n_; ++i) sum += values.as<float>()[i];
    host_mean_ = n_ > 0 ? sum / static_cast<double>(n_) : 0.0;
    return absl::OkStatus();
  }
  if (done_ == nullptr) {
    cudaEvent_t e;
    RECFLEET_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "loss read-back event"));
    done_ = e;
  }
  const size_t bytes = static_cast<size_t>(n_) * sizeof(float);
  if (bytes > capacity_) {
    // The previous copy may still be writing the old buffer.
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(E(done_)), "loss read-back"));
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    capacity_ = 0;
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&pinned_, bytes), "cudaMallocHost"));
    capacity_ = bytes;
  }
  if (bytes > 0) {
    RECFLEET_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(pinned_, values.data, bytes, cudaMemcpyDeviceToHost, nullptr),
        "loss read-back copy"));
  }
  return CudaStatus(cudaEventRecord(E(done_), nullptr), "loss read-back event");
}

absl::StatusOr<double> DeferredMean::Read() {
  if (!enqueued_) return absl::FailedPreconditionError("DeferredMean::Read before Enqueue");
  if (!on_device_) return host_mean_;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(E(done_)), "loss read-back"));
  double sum = 0;
  const float* v = static_cast<const float*>(pinned_);
  for (int64_t i = 0; i < n_; ++i) sum += v[i];
  return n_ > 0 ? sum / static_cast<double>(n_) : 0.0;
}

}  // namespace recfleet::engine::layers
