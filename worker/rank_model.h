#ifndef RECFLEET_WORKER_RANK_MODEL_H_
#define RECFLEET_WORKER_RANK_MODEL_H_

// What one rank of a job trains, whatever its device and layout: the
// interface RankRun (rank_run.h) drives. Two implementations:
//   DistributedModel (distributed_model.h)  CPU ranks of any world size
//       (Gloo) and CUDA ranks of a world of several (NCCL): dense FSDP,
//       sharded tables, expert groups;
//   SingleRankModel (single_rank_model.h)   a world of one on the CPU or a
//       CUDA device: the engine's own tables and optimizers.
// Both write the same checkpoint records (a dense range, table row ranges,
// their optimizer state) under the same fingerprint, so a checkpoint of one
// restores into the other.
//
// Not thread-safe; every rank of the job calls TrainStep / Predict /
// GatherDense together (they may run collectives).

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/batch.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "worker/checkpoint.h"

namespace recfleet::worker {

class RankModel {
 public:
  struct Times {
    // Time the device computed (CUDA: stream time from events; CPU: wall).
    double compute_seconds = 0;
    // Collectives the step waited for (embedding all-to-alls included).
    double comm_seconds = 0;
  };

  virtual ~RankModel() = default;

  // One synchronous training step on this rank's `batch` (>= 1 sample).
  // `overlap`, when set, runs once inside the step while the device works
  // on it (after the backward is issued): the caller loads the next batch
  // there and hands it to Prefetch. Its error ends the step.
  virtual absl::StatusOr<engine::StepResult> TrainStep(const engine::Batch& batch, Times* times,
                                                       const std::function<absl::Status()>& overlap) = 0;
  // Starts moving `next` to the device during the current step (CUDA); a
  // later TrainStep of the same Batch object uses the copy. No-op on CPU.
  virtual absl::Status Prefetch(const engine::Batch& next) = 0;
  // Logits of `head` for `batch`; nullptr when this rank has no samples in
  // this round (it still serves the other ranks' lookups). Every rank calls
  // it the same number of times.
  virtual absl::StatusOr<std::vector<double>> Predict(const engine::Batch* batch, engine::Head head) = 0;
  // Makes the current parameters usable by Predict (after the last
  // TrainStep).
  virtual absl::Status GatherDense() = 0;
  // This rank's part of a checkpoint: the records of the shards it owns.
  virtual absl::Status Save(CheckpointShard* shard) = 0;
  // Restores this rank's shards from every rank's records of a checkpoint.
  // DataLoss when the records do not cover them or belong to another model.
  virtual absl::Status Restore(const std::vector<CheckpointShard>& shards) = 0;
};

// "name:numel;" per dense parameter, then "table.<name>:<rows>x<dim>;" per
// table: what a checkpoint's "fingerprint" record must equal to restore.
std::string ModelFingerprint(const engine::GemLite<float>& model, const engine::FeatureSchema& schema, int64_t dim);

// The AdamW step count recorded in checkpoint shard `index`; DataLoss when
// the shard belongs to a model of another fingerprint or has no count.
absl::StatusOr<int64_t> CheckpointAdamStep(const CheckpointShard& shard, size_t index, const std::string& fingerprint);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_RANK_MODEL_H_
