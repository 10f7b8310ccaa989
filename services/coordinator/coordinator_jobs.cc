#include "services/coordinator/coordinator.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/job_model.h"
#include "services/coordinator/job_state.h"
#include "services/coordinator/list_filter.h"
#include "services/coordinator/spec_validation.h"
#include "services/coordinator/time_util.h"
#include "spdlog/spdlog.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::JobTransition;
using ::recfleet::v1::WatchJobResponse;

// ---------------------------------------------------------------------------
// State changes
// ---------------------------------------------------------------------------

absl::Status Coordinator::TransitionLocked(ActiveJob& aj, JobState to, const std::string& reason,
                                           const std::string& message,
                                           const std::function<void(JobStatus&)>& mutate) {
  const absl::Time now = options_.clock();
  JobStatus next = aj.job.status();
  next.set_state(to);
  next.set_reason(reason);
  next.set_message(message);
  ToProto(now, next.mutable_update_time());
  if (mutate) mutate(next);
  JobTransition t;
  t.set_from(aj.job.status().state());
  t.set_to(to);
  t.set_reason(reason);
  t.set_message(message);
  t.set_restart_epoch(next.restart_epoch());
  ToProto(now, t.mutable_time());
  if (absl::Status s = store_->RecordTransition(aj.id, next, t); !s.ok()) return s;
  *aj.job.mutable_status() = std::move(next);
  if (to == JobStatus::QUEUED || to == JobStatus::RESTARTING) {
    waiting_.insert({aj.order, aj.id});
  } else {
    waiting_.erase({aj.order, aj.id});
  }
  transitions_->WithLabels({StateName(to)}).Increment();
  WatchJobResponse event;
  event.set_kind(WatchJobResponse::STATE_CHANGE);
  *event.mutable_job() = aj.job;
  *event.mutable_transition() = std::move(t);
  EmitLocked(aj.id, std::move(event));
  return absl::OkStatus();
}

absl::Status Coordinator::EndJobLocked(ActiveJob& aj, JobState to, const std::string& reason,
                                       const std::string& message) {
  ComputeProgressLocked(aj);
  absl::Status s = TransitionLocked(aj, to, reason, message, [&](JobStatus& st) {
    ToProto(options_.clock(), st.mutable_end_time());
  });
  if (!s.ok()) return s;
  ReleaseWorkersLocked(aj);
  rendezvous_.Close(aj.job.name());
  events_.MarkEnded(aj.id, options_.clock());
  for (const std::string& w : aj.job.status().workers()) pending_relink_.erase(w);
  waiting_.erase({aj.order, aj.id});
  jobs_.erase(aj.id);
  schedule_dirty_ = true;
  return absl::OkStatus();
}

void Coordinator::ReleaseWorkersLocked(ActiveJob& aj) {
  for (const std::string& id : aj.job.status().workers()) {
    WorkerRecord* w = registry_.Find(id);
    if (w != nullptr && w->job_id == aj.id) {
      w->job_id.clear();
      w->rank = -1;
      w->epoch = 0;
    }
  }
  aj.started.clear();
  schedule_dirty_ = true;
}

int Coordinator::MaxRestarts(const ActiveJob& aj) const {
  int n = aj.job.spec().training().max_restarts();
  return n > 0 ? n : options_.default_max_restarts;
}

void Coordinator::FailAttemptLocked(ActiveJob& aj, const std::string& reason,
                                    const std::string& message) {
  const JobState state = aj.job.status().state();
  absl::Status s;
  if (state == JobStatus::SCHEDULING) {
    if (reason == "WorkerFailed") {
      // The job itself failed to start (missing dataset, unreachable
      // loader, ...): that counts against its restart budget, and it waits
      // before the next try, so a job that cannot start ends FAILED in
      // bounded time with the worker's reason instead of cycling.
      if (aj.restarts >= MaxRestarts(aj)) {
        s = EndJobLocked(aj, JobStatus::FAILED, "StartFailed",
                         absl::StrCat("failed to start ", aj.restarts + 1, " times; last failure: ", message));
        if (!s.ok()) spdlog::error("{}", std::string(s.message()));
        return;  // `aj` is gone.
      }
      ++aj.restarts;
      aj.not_before = options_.clock() + std::min(absl::Seconds(30), absl::Seconds(1) * (1 << (aj.restarts - 1)));
    }
    s = TransitionLocked(aj, JobStatus::QUEUED, reason, message, nullptr);
  } else if (state == JobStatus::RUNNING && aj.restarts < MaxRestarts(aj)) {
    ComputeProgressLocked(aj);
    s = TransitionLocked(aj, JobStatus::RESTARTING, reason, message, nullptr);
    if (s.ok()) ++aj.restarts;
  } else if (state == JobStatus::RUNNING) {
    s = EndJobLocked(aj, JobStatus::FAILED, "RestartBudgetExhausted",
                     absl::StrCat("gave up after ", aj.restarts, " restarts; last failure: ",
                                  reason, ": ", message));
    if (!s.ok()) spdlog::error("{}", std::string(s.message()));
    return;  // `aj` is gone.
  } else {
    return;  // QUEUED / RESTARTING hold no workers.
  }
  if (!s.ok()) {
    // The store refused the write; the job keeps its state and the next
    // failure report or lease sweep retries.
    spdlog::error("{}", std::string(s.message()));
    return;
  }
  ReleaseWorkersLocked(aj);
  rendezvous_.Close(aj.job.name());
}

// ---------------------------------------------------------------------------
// JobService
// ---------------------------------------------------------------------------

absl::StatusOr<Job> Coordinator::CreateJob(const ::recfleet::v1::CreateJobRequest& request) {
  if (!request.has_spec()) {
    return absl::InvalidArgumentError("spec is required (the JobSpec to run)");
  }
  if (absl::Status s = ValidateJobSpec(request.spec()); !s.ok()) return s;
  if (absl::Status s = CheckDatasetsUnderRoot(request.spec(), options_.data_root); !s.ok()) return s;
  // A well-formed spec must also be one recfleet builds: a field nothing
  // honors is rejected here, never dropped or failed at worker start.
  if (absl::Status s = engine::CheckBuildable(request.spec()); !s.ok()) return s;
  const std::string& rid = request.request_id();
  if (rid.size() > 128 || rid.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                "0123456789._-") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id must be at most 128 characters of [A-Za-z0-9._-], got \"", rid, "\""));
  }
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  // A retry of a request that created its job: that job, as Create would
  // return it, without reading the dataset again.
  auto created_before = [&]() -> absl::StatusOr<std::optional<Job>> {
    absl::StatusOr<std::optional<Job>> existing = store_->FindCreated(request.spec(), rid, request.job_id());
    if (!existing.ok() || !existing->has_value()) return existing;
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(*ParseJobName((*existing)->name(), "name"));
    return it != jobs_.end() ? std::optional<Job>(it->second.job) : *existing;
  };
  absl::StatusOr<std::optional<Job>> existing = created_before();
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return **existing;
  // The dataset is read here, before the lock (file I/O that may be slow),
  // once per job; every placement is planned from it.
  absl::StatusOr<PlanningData> planning_data = options_.planning_data_reader(request.spec());
  if (!planning_data.ok()) {
    // A dataset that is there but cannot be read: no job is created, unless
    // a concurrent retry of this request created it meanwhile.
    existing = created_before();
    if (!existing.ok()) return existing.status();
    if (!existing->has_value()) return planning_data.status();
    return **existing;
  }
  absl::MutexLock lock(&mu_);
  bool created = false;
  absl::StatusOr<Job> job =
      store_->Create(request.spec(), rid, options_.clock(), &created, request.job_id());
  if (!job.ok()) return job.status();
  if (!created) {
    auto it = jobs_.find(*ParseJobName(job->name(), "name"));
    return it != jobs_.end() ? it->second.job : *job;
  }
  jobs_created_->Increment();
  transitions_->WithLabels({StateName(JobStatus::QUEUED)}).Increment();
  const std::string id = *ParseJobName(job->name(), "name");
  ActiveJob& aj = jobs_[id];
  aj.id = id;
  aj.order = next_order_++;
  aj.job = *job;
  aj.planning_data = std::move(planning_data);
  waiting_.insert({aj.order, id});
  WatchJobResponse event;
  event.set_kind(WatchJobResponse::STATE_CHANGE);
  *event.mutable_job() = aj.job;
  event.mutable_transition()->set_to(JobStatus::QUEUED);
  event.mutable_transition()->set_reason("Submitted");
  *event.mutable_transition()->mutable_time() = aj.job.status().create_time();
  EmitLocked(id, std::move(event));
  schedule_dirty_ = true;
  ScheduleLocked();
  auto it = jobs_.find(id);
  return it != jobs_.end() ? it->second.job : *job;
}

absl::StatusOr<Job> Coordinator::LoadJobLocked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return it->second.job;
  return store_->Get(id);
}

absl::StatusOr<Job> Coordinator::GetJob(const ::recfleet::v1::GetJobRequest& request) {
  absl::StatusOr<std::string> id = ParseJobName(request.name(), "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  return LoadJobLocked(*id);
}

absl::StatusOr<::recfleet::v1::ListJobEventsResponse> Coordinator::ListJobEvents(
    const ::recfleet::v1::ListJobEventsRequest& request) {
  absl::StatusOr<std::string> id = ParseJobName(request.name(), "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  // NOT_FOUND for a job that never was (or was deleted), rather than an
  // empty history.
  if (absl::StatusOr<Job> job = LoadJobLocked(*id); !job.ok()) return job.status();
  absl::StatusOr<std::vector<::recfleet::v1::JobTransition>> transitions =
      store_->Transitions(*id);
  if (!transitions.ok()) return transitions.status();
  ::recfleet::v1::ListJobEventsResponse out;
  for (auto& t : *transitions) *out.add_events() = std::move(t);
  return out;
}

absl::StatusOr<::recfleet::v1::ListJobsResponse> Coordinator::ListJobs(
    const ::recfleet::v1::ListJobsRequest& request) {
  // AIP-158: a page_size over the maximum is read as the maximum.
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be >= 0 (0 = 50, at most 1000), got ", request.page_size()));
  }
  const int page_size = request.page_size() == 0 ? 50 : std::min(request.page_size(), 1000);
  JobStore::Query query;
  for (int s : request.states()) {
    if (s == JobStatus::STATE_UNSPECIFIED || !JobStatus::State_IsValid(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("states must name real job states (QUEUED ... CANCELLED), got ", s));
    }
    query.states.insert(static_cast<JobState>(s));
  }
  absl::StatusOr<std::map<std::string, std::string>> labels = ParseLabelFilter(request.filter());
  if (!labels.ok()) return labels.status();
  query.labels = *std::move(labels);
  absl::StatusOr<JobStore::Page> page = store_->List(page_size, request.page_token(), query);
  if (!page.ok()) return page.status();
  ::recfleet::v1::ListJobsResponse out;
  absl::MutexLock lock(&mu_);
  for (Job& job : page->jobs) {
    // Active jobs: the in-memory status carries the freshest progress.
    auto it = jobs_.find(job.name().substr(5));
    *out.add_jobs() = it != jobs_.end() ? it->second.job : std::move(job);
  }
  out.set_next_page_token(page->next_page_token);
  return out;
}

absl::StatusOr<Job> Coordinator::CancelJob(const ::recfleet::v1::CancelJobRequest& request) {
  absl::StatusOr<std::string> id = ParseJobName(request.name(), "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(*id);
  if (it == jobs_.end()) {
    absl::StatusOr<Job> job = store_->Get(*id);
    if (!job.ok()) return job.status();
    if (job->status().state() == JobStatus::CANCELLED) return job;
    return absl::FailedPreconditionError(
        absl::StrCat(job->name(), " already ", StateName(job->status().state()),
                     "; only QUEUED, SCHEDULING, RUNNING or RESTARTING jobs can be cancelled"));
  }
  std::string message = request.reason().empty() ? "cancelled by user" : request.reason();
  if (absl::Status s = EndJobLocked(it->second, JobStatus::CANCELLED, "CancelledByUser", message);
      !s.ok()) {
    return s;
  }
  return store_->Get(*id);
}

absl::Status Coordinator::DeleteJob(const ::recfleet::v1::DeleteJobRequest& request) {
  absl::StatusOr<std::string> id = ParseJobName(request.name(), "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  if (auto it = jobs_.find(*id); it != jobs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        request.name(), " is ", StateName(it->second.job.status().state()),
        "; only SUCCEEDED, FAILED or CANCELLED jobs can be deleted (cancel it first)"));
  }
  if (absl::Status s = store_->Delete(*id); !s.ok()) return s;
  events_.Forget(*id);
  if (history_.erase(request.name()) > 0) {
    history_order_.erase(
        std::find(history_order_.begin(), history_order_.end(), request.name()));
  }
  return absl::OkStatus();
}

}  // namespace recfleet::coordinator
