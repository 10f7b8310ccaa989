#ifndef RECFLEET_WORKER_BATCH_PLAN_H_
#define RECFLEET_WORKER_BATCH_PLAN_H_

// Which training samples every rank takes at every step when a worker reads
// the dataset itself (no data-loader in the assignment). Epoch e is a
// permutation of all samples fixed by (seed, e); step s of the epoch gives
// rank r the slice [(s * world + r) * batch, +batch) of it. Samples left
// over at the end of an epoch (fewer than world * batch) wait for no one:
// the next epoch starts with a new permutation. So (seed, epoch, step) fixes
// exactly which samples each rank sees, every sample is seen at most once
// per epoch, and a run resumed at step k sees what an uninterrupted run
// would have from step k on.
//
// Immutable after Create; thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace recfleet::worker {

class BatchPlan {
 public:
  // InvalidArgument when the dataset cannot fill one step.
  static absl::StatusOr<BatchPlan> Create(int64_t num_samples, int world_size, int64_t local_batch, uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // Dataset rows of `rank` at 1-based global step `step`.
  std::vector<int64_t> Rows(int64_t step, int rank) const;

  // The permutation of epoch `epoch` (0-based): a Fisher-Yates shuffle
  // driven by a SplitMix64 stream, identical on every platform.
  static std::vector<int64_t> EpochPermutation(int64_t num_samples, uint64_t seed, int64_t epoch);

 private:
  BatchPlan(int64_t n, int world, int64_t batch, uint64_t seed)
      : num_samples_(n), world_size_(world), local_batch_(batch), seed_(seed),
        steps_per_epoch_(n / (static_cast<int64_t>(world) * batch)) {}

  int64_t num_samples_;
  int world_size_;
  int64_t local_batch_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_BATCH_PLAN_H_
