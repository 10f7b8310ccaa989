#ifndef RECFLEET_WORKER_RANK_RUN_H_
#define RECFLEET_WORKER_RANK_RUN_H_

// One attempt at one rank of a training job, free of transport: the step
// code every run of recfleet goes through, whether the worker daemon runs
// it for an Assignment (training_task.h: gRPC reports, the coordinator's
// key-value store) or `recfleet train --local` runs it with a world of one
// (printed reports, an in-process store).
//
//  1. Builds the model from the spec (engine/job_model.h) and opens its
//     rank's data from the job's DataConfig: streamed by the assignment's
//     data-loader, or dealt in-process by the same loader code.
//  2. Joins the job's collectives through `store`: the world (Gloo, host
//     integers), and the training groups (Gloo on CPU ranks, NCCL on CUDA
//     ranks) (FSDP, replica, tables, table replica, and the
//     expert-parallel group when the plan has one) from
//     the plan's groups in the assignment, or from the spec's parallelism
//     hints when it carries none. A stop request aborts every communicator
//     so no collective waits out its timeout.
//  3. Resumes from the newest complete checkpoint: parameters, optimizer
//     state (AdamW moments, Adagrad accumulators) and the data position
//     (the step) come back exactly, so no sample is skipped or trained
//     twice.
//  4. Trains synchronously. CPU ranks: DistributedModel, dense parameters
//     sharded FSDP-style inside the FSDP group and replicated across groups,
//     embedding tables sharded over the table group exactly as the
//     assignment's plan placed them (all-to-all lookups and updates), the
//     experts spread over the plan's expert-parallel group (token
//     all-to-alls); the same parameters as one rank on the global batch.
//     CUDA ranks (options.device) of a world of several: the same
//     DistributedModel on the CUDA engine, its buffers on the GPU, over
//     NCCL (one rank per GPU). A CUDA world of one: SingleRankModel on the
//     GPU (nothing to exchange), which loads the next batch while the
//     device computes and prefetches it to the device.
//  5. Reports StepStats (step time split into data wait / compute / comm)
//     and EvalStats (every rank scores its slice of the eval set, rank 0
//     reports) to `sink`, updates `metrics`, and every
//     spec.training.checkpoint_every steps writes a sharded checkpoint
//     (each rank the shards it owns; rank 0 commits the manifest after a
//     barrier).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/tensor.h"
#include "recfleet/v1/worker_service.pb.h"
#include "services/dataloader/job_loader.h"
#include "worker/agent.h"
#include "worker/comm/kv_store.h"
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
  // The workers' bearer token for coordinator and data-loader calls ("" =
  // none). The loader also gets the assignment's data grant.
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
  // Where datasets are found when the rank reads its data itself (no
  // data-loader in the assignment), and the eval set.
  dataloader::DatasetOptions datasets;
  // Where the rank trains. kCuda: on CUDA device `gpu_index`, which must be
  // the only device this process trains on (engine/cuda_device.h,
  // SetCudaDevice), in bf16 (bf16 GEMMs and attention, fp32 master
  // weights) or fp32.
  Device device = Device::kCpu;
  int gpu_index = 0;
  bool bf16 = true;
  // Peak FLOP/s that MFU divides by: `cuda_peak_flops` on CUDA (0: the
  // device's dense bf16 datasheet peak by name, PeakBf16FlopsOf; MFU is not
  // exported and the summary says "n/a" when that is unknown too),
  // kCpuNominalPeakFlops (worker_metrics.h) for the CPU's /metrics (the
  // summary line says "n/a": a CPU has no datasheet peak).
  double cuda_peak_flops = 0;
};

// Where a rank's progress goes. Called from the training thread only.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual void ReportStep(const v1::StepStats& step) = 0;
  virtual void ReportEval(const v1::EvalStats& eval) = 0;
  // Delivers what is pending (when `force`, or when the sink chooses to).
  // An error stops the run (e.g. the coordinator fenced this attempt off).
  virtual absl::Status Flush(bool force) = 0;
};

// Runs `assignment` to its end on the calling thread: OK when every step is
// trained, checkpointed and evaluated. Returns promptly after a stop
// request on `control`.
absl::Status RunRank(const v1::Assignment& assignment, TaskControl& control, comm::KvStore& store, ProgressSink& sink,
                     const TrainingOptions& options, WorkerMetrics* metrics);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_RANK_RUN_H_
