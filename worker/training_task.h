#ifndef RECFLEET_WORKER_TRAINING_TASK_H_
#define RECFLEET_WORKER_TRAINING_TASK_H_

// One rank of a training job: what the worker daemon runs for an
// Assignment.
//
//  1. Builds GEM-lite from spec.model (job_model.h) and reads its rank's
//     data: the dataset's rows through a BatchPlan fixed by
//     (seed, epoch, step), so every rank of every attempt agrees on which
//     samples each step holds.
//  2. Joins the job's collectives (Gloo) through the coordinator's
//     rendezvous store for the assignment's restart epoch: the world, and
//     the four training groups (FSDP, replica, tables, table replica) from
//     the plan's groups in the assignment, or from the spec's parallelism
//     hints when it carries none. An Abort or a stop request aborts every
//     communicator so no collective waits out its timeout.
//  3. Resumes from the newest complete checkpoint: parameters, optimizer
//     state (AdamW moments, Adagrad accumulators) and the data position
//     (the step) come back exactly, so no sample is skipped or trained
//     twice.
//  4. Trains synchronously with DistributedModel: dense parameters sharded
//     FSDP-style inside the FSDP group and replicated across groups,
//     embedding tables sharded over the table group (all-to-all lookups
//     and updates); the same parameters as one rank on the global batch.
//  5. Reports StepStats (step time split into data wait / compute / comm)
//     and EvalStats (every rank scores its slice of the eval set, rank 0
//     reports) to the coordinator, updates /metrics, and every
//     spec.training.checkpoint_every steps writes a sharded checkpoint
//     (each rank the shards it owns; rank 0 commits the manifest after a
//     barrier).

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "worker/agent.h"
#include "worker/worker_metrics.h"

namespace recfleet::worker {

struct TrainingOptions {
  // Checkpoints go to spec.training.checkpoint_dir, or
  // <checkpoint_root>/<job id> when the spec leaves it empty. Every rank of
  // a job must see the same directory (shared storage; on one host any
  // directory), since rank 0 verifies all shards before committing.
  std::string checkpoint_root;
  // Address other ranks reach this worker's Gloo transport on.
  std::string gloo_host = "127.0.0.1";
  // Bearer token for coordinator and data-loader calls ("" = none).
  std::string auth_token;
  // Transport security of the data-loader channels (services/common/tls.h);
  // null = plain text.
  std::shared_ptr<grpc::ChannelCredentials> loader_credentials;
  // Bound on every collective and on the rendezvous.
  absl::Duration comm_timeout = absl::Seconds(60);
  // When non-empty: append "<step> <sample_id>..." for every trained step
  // to <sample_log_dir>/<job id>.rank-<r>.epoch-<restart epoch>.log, an
  // audit trail of exactly which samples each attempt trained.
  std::string sample_log_dir;
  // Complete checkpoints kept per job.
  int keep_checkpoints = 2;
  // Progress line on stderr every this many steps (0 = none).
  int64_t log_every = 20;
};

class TrainingTask : public TaskRunner {
 public:
  // `metrics` must outlive the task.
  TrainingTask(std::shared_ptr<v1::WorkerService::StubInterface> stub, TrainingOptions options,
               WorkerMetrics* metrics);

  absl::Status Run(const v1::Assignment& assignment, TaskControl& control) override;

 private:
  const std::shared_ptr<v1::WorkerService::StubInterface> stub_;
  const TrainingOptions options_;
  WorkerMetrics* const metrics_;
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_TRAINING_TASK_H_
