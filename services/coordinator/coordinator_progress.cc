#include "services/coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/time_util.h"
#include "spdlog/spdlog.h"

namespace recfleet::coordinator {

using ::recfleet::v1::JobProgress;
using ::recfleet::v1::WatchJobResponse;

absl::StatusOr<::recfleet::v1::ReportStepResponse> Coordinator::ReportStep(
    const ::recfleet::v1::ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<WorkerRecord*> authenticated =
      registry_.Authenticate(request.worker_id(), request.worker_credential());
  if (!authenticated.ok()) return authenticated.status();
  WorkerRecord* w = *authenticated;
  auto it = jobs_.find(w->job_id);
  if (w->idle() || it == jobs_.end() || request.job() != it->second.job.name() ||
      request.restart_epoch() != w->epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w->id, " holds no assignment for ", request.job(), " at restart_epoch ",
        request.restart_epoch(),
        w->idle() ? std::string(" (it is idle)")
                  : absl::StrCat(" (it holds jobs/", w->job_id, " epoch ", w->epoch, ")")));
  }
  ActiveJob& aj = it->second;
  if (request.rank() < w->rank || request.rank() >= w->rank + aj.ranks_per_worker ||
      request.rank() >= aj.progress.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank must be in [", w->rank, ", ", w->rank + aj.ranks_per_worker,
                     ") for worker ", w->id, ", got ", request.rank()));
  }
  step_reports_->Increment(aj.progress.Record(request.rank(), request.steps()));
  if (request.has_eval()) {
    JobProgress* p = aj.job.mutable_status()->mutable_progress();
    p->set_eval_step(request.eval().step());
    p->set_eval_auc(request.eval().auc());
    p->set_eval_ne(request.eval().ne());
  }
  aj.progress_dirty = true;
  if (options_.clock() - aj.last_publish >= options_.progress_interval) {
    PublishProgressLocked(aj);
  }
  ::recfleet::v1::ReportStepResponse out;
  *out.mutable_progress() = aj.job.status().progress();
  return out;
}

void Coordinator::ComputeProgressLocked(ActiveJob& aj) {
  JobProgress* p = aj.job.mutable_status()->mutable_progress();
  aj.progress.Compute(*p);
  ToProto(options_.clock(), p->mutable_update_time());
}

void Coordinator::PublishProgressLocked(ActiveJob& aj) {
  ComputeProgressLocked(aj);
  aj.progress_dirty = false;
  aj.last_publish = options_.clock();
  *aj.job.mutable_status()->mutable_update_time() = aj.job.status().progress().update_time();
  if (absl::Status s = store_->SaveStatus(aj.id, aj.job.status()); !s.ok()) {
    spdlog::error("saving progress of {}: {}", aj.job.name(), std::string(s.message()));
  }
  WatchJobResponse event;
  event.set_kind(WatchJobResponse::PROGRESS);
  *event.mutable_job() = aj.job;
  EmitLocked(aj.id, std::move(event));
}

}  // namespace recfleet::coordinator
