#ifndef RECFLEET_ENGINE_LAYERS_STAGED_BATCH_H_
#define RECFLEET_ENGINE_LAYERS_STAGED_BATCH_H_

// The arrays of one batch (engine/batch.h) where the model computes. For a
// CPU model the views point into the Batch's own vectors (no copy). For a
// CUDA model Stage() packs every array into one pinned host buffer and moves
// it with a single cudaMemcpyAsync on a copy stream of its own, so the copy
// of the next batch overlaps the current step (double buffering: the model
// keeps two StagedBatch objects and alternates). The compute stream waits on
// the copy's event (WaitReady) before the first use; the next Stage() into
// the same object waits for the compute stream's MarkConsumed event before
// overwriting the device buffer, and for its own previous copy before
// refilling the pinned buffer.
//
// Every array keeps its host type: ids and offsets int64, dense features and
// labels fp32. Buffers grow to the largest batch seen and are reused. Not
// thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/batch.h"
#include "kernels/tensor.h"

namespace recfleet::engine::layers {

class StagedBatch {
 public:
  StagedBatch() = default;
  ~StagedBatch();
  StagedBatch(const StagedBatch&) = delete;
  StagedBatch& operator=(const StagedBatch&) = delete;

  // Makes the views of `batch` on `device`. For kCpu the batch must outlive
  // the views. For kCuda the copy is asynchronous (call WaitReady before
  // using the views on the compute stream).
  absl::Status Stage(const Batch& batch, Device device);
  // The compute stream (cudaStream_t; nullptr = legacy default) waits for
  // the copy. No-op on the CPU.
  absl::Status WaitReady(void* compute_stream);
  // The compute stream's last use of these views has been enqueued.
  absl::Status MarkConsumed(void* compute_stream);

  const Batch* batch() const { return batch_; }
  // Counts Stage() calls: tells one staging of a Batch object from the next.
  uint64_t generation() const { return generation_; }
  // int64 [n] ids and [size + 1] offsets of id-list feature f.
  JaggedView id_list(size_t f) const { return id_lists_[f]; }
  // int64 [tokens] ids of sequence field f, and the shared offsets.
  const TensorView& sequence_ids(size_t f) const { return sequence_ids_[f]; }
  const TensorView& sequence_offsets() const { return sequence_offsets_; }
  // fp32 [size, num_dense] (empty when num_dense == 0) and [size] labels per
  // head (empty when the batch has none).
  const TensorView& dense() const { return dense_; }
  const TensorView& labels(int head) const { return labels_[head]; }

 private:
  absl::Status EnsureBuffers(size_t bytes);

  const Batch* batch_ = nullptr;
  uint64_t generation_ = 0;
  std::vector<JaggedView> id_lists_;
  std::vector<TensorView> sequence_ids_;
  TensorView sequence_offsets_, dense_, labels_[2];

  // CUDA only.
  void* pinned_ = nullptr;
  void* device_ = nullptr;
  size_t capacity_ = 0;
  void* copy_stream_ = nullptr;  // cudaStream_t, non-blocking.
  void* copied_ = nullptr;       // cudaEvent_t
  void* consumed_ = nullptr;     // cudaEvent_t
  bool copy_pending_ = false, consume_recorded_ = false;
};

// The mean of a vector the compute stream produces, read back without
// stopping the stream: Enqueue copies fp32 values [n] (CUDA: into pinned
// host memory with cudaMemcpyAsync on the legacy default stream, then an
// event) and returns at once; Read waits for that copy only and averages on
// the host. On the CPU Enqueue reads the values at once. One copy in flight
// per object (a new Enqueue replaces an unread one). Not thread-safe.
class DeferredMean {
 public:
  DeferredMean() = default;
  ~DeferredMean();
  DeferredMean(const DeferredMean&) = delete;
  DeferredMean& operator=(const DeferredMean&) = delete;

  absl::Status Enqueue(const TensorView& values);
  // FailedPrecondition when nothing was enqueued.
  absl::StatusOr<double> Read();

 private:
  void* pinned_ = nullptr;  // float[capacity_]
  size_t capacity_ = 0;
  void* done_ = nullptr;  // cudaEvent_t
  int64_t n_ = 0;
  bool enqueued_ = false, on_device_ = false;
  double host_mean_ = 0;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_STAGED_BATCH_H_
