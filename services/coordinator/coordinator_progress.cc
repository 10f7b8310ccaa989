#include "services/coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/time_util.h"
#include "spdlog/spdlog.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Job;
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
  if (p->step() <= 0) return;
  auto [it, fresh] = history_.try_emplace(aj.job.name());
  if (fresh) {
    history_order_.push_back(aj.job.name());
    if (history_order_.size() > kMaxHistories) {
      history_.erase(history_order_.front());
      history_order_.pop_front();
    }
  }
  it->second.Add(*p);
}

std::string Coordinator::StatusPage() {
  absl::StatusOr<JobStore::Page> page = store_->List(100, "", {});
  std::vector<Job> jobs;
  absl::MutexLock lock(&mu_);
  if (page.ok()) {
    for (Job& job : page->jobs) {
      // Active jobs: the in-memory status carries the freshest progress.
      auto it = jobs_.find(job.name().substr(5));
      jobs.push_back(it != jobs_.end() ? it->second.job : std::move(job));
    }
  }
  std::string html = RenderStatusPage(jobs, history_, options_.clock());
  if (!page.ok()) {
    html.insert(html.find("</body>"),
                absl::StrCat("<p>job store: ", HtmlEscape(page.status().ToString()), "</p>"));
  }
  return html;
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
