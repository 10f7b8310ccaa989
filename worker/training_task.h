#ifndef RECFLEET_WORKER_TRAINING_TASK_H_
#define RECFLEET_WORKER_TRAINING_TASK_H_

// The worker daemon's TaskRunner: runs an Assignment's rank with
// RunRank (rank_run.h), reporting progress to the coordinator over gRPC and
// meeting the job's other ranks through its epoch-fenced key-value store.
// On a GPU worker (options.device kCuda) a job with
// spec.resources.gpus_per_worker = 1 trains on the GPU, one with 0 on the
// CPU; more than 1 is refused (one GPU per worker process).

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "worker/agent.h"
#include "worker/rank_run.h"
#include "worker/worker_metrics.h"

namespace recfleet::worker {

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
