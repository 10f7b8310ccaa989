#include "worker/training_task.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"
#include "worker/comm/grpc_kv_store.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Sends batched step reports; stops the task on a fencing error.
class Reporter : public ProgressSink {
 public:
  Reporter(v1::WorkerService::StubInterface* stub, const v1::Assignment& a, const TaskControl& control,
           const std::string& token)
      : stub_(stub), control_(control), token_(token) {
    pending_.set_worker_id(control.worker_id());
    pending_.set_job(a.job());
    pending_.set_restart_epoch(a.restart_epoch());
    pending_.set_rank(a.rank());
  }
  void ReportStep(const v1::StepStats& s) override { *pending_.add_steps() = s; }
  void ReportEval(const v1::EvalStats& e) override { *pending_.mutable_eval() = e; }

  // Sends what is pending if `force` or half a second has passed. A report
  // that fails for another reason than fencing stays pending and goes out
  // with the next one (the coordinator skips steps it already has): the
  // coordinator accepts rank 0's completion only once its reports reached
  // the last step, so they must not be lost to a coordinator restart. A
  // forced flush (checkpoints, evals, the end) retries for a while.
  absl::Status Flush(bool force) override {
    if (pending_.steps_size() == 0 && !pending_.has_eval()) return absl::OkStatus();
    if (!force && Since(last_) < 0.5) return absl::OkStatus();
    constexpr int kForcedAttempts = 12;
    for (int attempt = 1;; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
      v1::ReportStepResponse resp;
      pending_.set_worker_credential(control_.worker_credential());
      grpc::Status s = stub_->ReportStep(&ctx, pending_, &resp);
      last_ = Clock::now();
      if (s.ok()) {
        pending_.clear_steps();
        pending_.clear_eval();
        return absl::OkStatus();
      }
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        return absl::FailedPreconditionError(absl::StrCat("ReportStep: ", s.error_message()));
      }
      // Progress reports are advisory while training: it continues through a
      // coordinator hiccup, and the lease (heartbeats) decides liveness.
      spdlog::warn("{}", absl::StrFormat("ReportStep failed (%d step(s) kept for the next report): %s",
                                         pending_.steps_size(), s.error_message().c_str()));
      if (!force || attempt >= kForcedAttempts) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

 private:
  v1::WorkerService::StubInterface* stub_;
  const TaskControl& control_;
  const std::string token_;
  v1::ReportStepRequest pending_;
  Clock::time_point last_ = Clock::now();
};

}  // namespace

TrainingTask::TrainingTask(std::shared_ptr<v1::WorkerService::StubInterface> stub, TrainingOptions options,
                           WorkerMetrics* metrics)
    : stub_(std::move(stub)), options_(std::move(options)), metrics_(metrics) {}

absl::Status TrainingTask::Run(const v1::Assignment& assignment, TaskControl& control) {
  Reporter reporter(stub_.get(), assignment, control, options_.auth_token);
  comm::GrpcKvStore store(stub_, assignment.job(), assignment.restart_epoch(), absl::Seconds(10), options_.auth_token);
  store.set_identity([&control] { return comm::GrpcKvStore::Identity{control.worker_id(), control.worker_credential()}; });
  // The spec decides the device: a job asking for no GPUs trains on the CPU
  // reference engine even on a GPU worker. A GPU worker owns one GPU, so it
  // runs one rank.
  TrainingOptions options = options_;
  const int gpus = assignment.spec().resources().gpus_per_worker();
  if (gpus == 0) options.device = Device::kCpu;
  if (gpus > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker trains one rank on one GPU; the job asks for ", gpus,
        " GPUs per worker (run one GPU per worker: resources.gpus_per_worker = 1)"));
  }
  absl::Status s = RunRank(assignment, control, store, reporter, options, metrics_);
  if (!s.ok() && control.stop_requested()) {
    return absl::CancelledError(absl::StrCat("stopped: ", s.message()));
  }
  return s;
}

}  // namespace recfleet::worker
