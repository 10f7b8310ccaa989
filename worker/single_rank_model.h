#ifndef RECFLEET_WORKER_SINGLE_RANK_MODEL_H_
#define RECFLEET_WORKER_SINGLE_RANK_MODEL_H_

// GEM-lite trained by a world of one, on the CPU or a CUDA device: the
// engine's own tables (rowwise Adagrad inside the model) and AdamW, no
// collectives. On CUDA the whole step stays on the device (engine/model.h,
// ExecutionOptions), the next batch is copied during the step (Prefetch),
// and compute time is the step's stream time from CUDA events, without the
// gap (if any) the device waited for the host between the backward and the
// optimizer step.
//
// Checkpoints hold the same records as DistributedModel's (dense range
// [0, numel), every table's rows [0, rows), AdamW moments, Adagrad
// accumulators, the AdamW step) under the same fingerprint, so a CPU job's
// checkpoint resumes here and the other way round.
//
// Not thread-safe.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/cuda_device.h"
#include "worker/rank_model.h"

namespace recfleet::worker {

class SingleRankModel : public RankModel {
 public:
  static absl::StatusOr<std::unique_ptr<SingleRankModel>> Create(const engine::GemLiteConfig& config,
                                                                 const engine::FeatureSchema& schema,
                                                                 const engine::ExecutionOptions& execution);

  absl::StatusOr<engine::StepResult> TrainStep(const engine::Batch& batch, Times* times,
                                               const std::function<absl::Status()>& overlap) override;
  absl::Status Prefetch(const engine::Batch& next) override { return model_->Prefetch(next); }
  absl::StatusOr<std::vector<double>> Predict(const engine::Batch* batch, engine::Head head) override;
  absl::Status GatherDense() override { return absl::OkStatus(); }
  absl::Status Save(CheckpointShard* shard) override;
  absl::Status Restore(const std::vector<CheckpointShard>& shards) override;

  engine::GemLite<float>& engine_model() { return *model_; }

 private:
  SingleRankModel() = default;

  engine::GemLiteConfig config_;
  engine::FeatureSchema schema_;
  std::unique_ptr<engine::GemLite<float>> model_;
  std::vector<std::string> dense_names_;
  int64_t dense_numel_ = 0;
  std::string fingerprint_;
  // CUDA only: marks 0..3 around the forward+backward and the update.
  std::unique_ptr<engine::CudaStreamTimer> timer_;
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_SINGLE_RANK_MODEL_H_
