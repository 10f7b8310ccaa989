#include "services/coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/time_util.h"
#include "spdlog/spdlog.h"

namespace recfleet::coordinator {

using ::recfleet::v1::JobStatus;
using ::recfleet::v1::TaskStatus;

namespace {

bool TaskActive(const TaskStatus& t) {
  return t.phase() == TaskStatus::STARTING || t.phase() == TaskStatus::RUNNING;
}

}  // namespace

// ---------------------------------------------------------------------------
// WorkerService
// ---------------------------------------------------------------------------

absl::StatusOr<::recfleet::v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const ::recfleet::v1::RegisterWorkerRequest& request) {
  absl::MutexLock lock(&mu_);
  WorkerRecord replaced;
  absl::StatusOr<WorkerRecord*> w = registry_.Register(request, options_.clock(), &replaced);
  if (!w.ok()) return w.status();
  registrations_->Increment();
  const std::string id = (*w)->id;
  if (!replaced.id.empty() && !replaced.idle()) {
    // A live worker registering again restarted and lost its task.
    auto it = jobs_.find(replaced.job_id);
    if (it != jobs_.end()) {
      FailAttemptLocked(it->second, "WorkerRestarted",
                        absl::StrCat("worker ", id, " on ", request.host(),
                                     " registered again while holding a task"));
    }
  } else if (auto relink = pending_relink_.find(id); relink != pending_relink_.end()) {
    // The coordinator restarted; the worker comes back to its running job.
    auto it = jobs_.find(relink->second);
    pending_relink_.erase(relink);
    if (it != jobs_.end() && it->second.job.status().state() == JobStatus::RUNNING) {
      const auto& ids = it->second.job.status().workers();
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] != id) continue;
        WorkerRecord* rec = registry_.Find(id);
        rec->job_id = it->first;
        rec->rank = i * it->second.ranks_per_worker;
        rec->epoch = it->second.job.status().restart_epoch();
      }
    }
  }
  schedule_dirty_ = true;
  ScheduleLocked();
  ::recfleet::v1::RegisterWorkerResponse out;
  out.set_worker_id(id);
  out.set_worker_credential(registry_.Find(id)->credential);
  out.set_lease_seconds(absl::ToDoubleSeconds(options_.lease));
  absl::Duration hb = options_.heartbeat_interval > absl::ZeroDuration()
                          ? options_.heartbeat_interval
                          : options_.lease / 3;
  out.set_heartbeat_interval_seconds(absl::ToDoubleSeconds(hb));
  return out;
}

::recfleet::v1::ListWorkersResponse Coordinator::ListWorkers() {
  ::recfleet::v1::ListWorkersResponse out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : registry_.workers()) {
    ::recfleet::v1::WorkerInfo* info = out.add_workers();
    // Field by field: the registration also holds the worker's credential.
    info->set_worker_id(id);
    info->set_host(w.info.host());
    *info->mutable_gpus() = w.info.gpus();
    *info->mutable_topology() = w.info.topology();
    info->set_metrics_address(w.info.metrics_address());
    info->set_state(w.idle() ? ::recfleet::v1::WorkerInfo::IDLE
                             : ::recfleet::v1::WorkerInfo::ASSIGNED);
    if (!w.idle()) {
      info->set_job(JobName(w.job_id));
      info->set_rank(w.rank);
      info->set_restart_epoch(w.epoch);
    }
    *info->mutable_task() = w.task;
    ToProto(w.registered, info->mutable_register_time());
    ToProto(w.lease_expiry, info->mutable_lease_expire_time());
  }
  return out;
}

void Coordinator::HandleTaskLocked(WorkerRecord& w, const TaskStatus& task) {
  auto it = jobs_.find(w.job_id);
  if (it == jobs_.end()) return;
  ActiveJob& aj = it->second;
  const JobState state = aj.job.status().state();
  switch (task.phase()) {
    case TaskStatus::RUNNING:
      aj.started.insert(w.id);
      if (state == JobStatus::SCHEDULING &&
          aj.started.size() == static_cast<size_t>(aj.job.status().workers_size())) {
        const bool first = !aj.job.status().has_start_time();
        TransitionLocked(aj, JobStatus::RUNNING, "AllRanksStarted",
                         absl::StrCat(aj.started.size(), " worker(s) running"),
                         [&](JobStatus& st) {
                           if (first) ToProto(options_.clock(), st.mutable_start_time());
                         })
            .IgnoreError();
      }
      break;
    case TaskStatus::SUCCEEDED: {
      if (w.rank != 0) break;  // Rank 0 speaks for the job.
      // A completion counts only once rank 0's own step reports reached the
      // last step: a claim alone (a confused or forged heartbeat) must not
      // end a job early. The worker repeats SUCCEEDED in every heartbeat, so
      // a completion whose last ReportStep was still in flight is accepted
      // on the heartbeat after that report lands.
      const int64_t steps = aj.job.spec().training().steps();
      if (aj.progress.world_size() == 0 || aj.progress.rank_step(0) < steps) {
        if (!aj.early_success_logged) {
          aj.early_success_logged = true;
          spdlog::warn(
              "{}: worker {} (rank 0) reports SUCCEEDED but its step reports reached step {} of "
              "{}; waiting for them",
              aj.job.name(), w.id,
              static_cast<long long>(aj.progress.world_size() == 0 ? 0 : aj.progress.rank_step(0)),
              static_cast<long long>(steps));
        }
        break;
      }
      if (state == JobStatus::SCHEDULING) {
        // Finished before every other worker's RUNNING report arrived.
        TransitionLocked(aj, JobStatus::RUNNING, "AllRanksStarted", "", [&](JobStatus& st) {
          if (!st.has_start_time()) ToProto(options_.clock(), st.mutable_start_time());
        }).IgnoreError();
      }
      EndJobLocked(aj, JobStatus::SUCCEEDED, "TrainingFinished",
                   absl::StrCat("rank 0 on worker ", w.id, " finished"))
          .IgnoreError();
      break;
    }
    case TaskStatus::FAILED:
      FailAttemptLocked(aj, "WorkerFailed",
                        absl::StrCat("worker ", w.id, " (", w.info.host(), "): ", task.message()));
      break;
    default:
      break;
  }
}

absl::StatusOr<::recfleet::v1::HeartbeatResponse> Coordinator::Heartbeat(
    const ::recfleet::v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<WorkerRecord*> renewed = registry_.Renew(request.worker_id(), request.worker_credential(), options_.clock());
  if (!renewed.ok()) return renewed.status();
  WorkerRecord& w = **renewed;
  const TaskStatus& task = request.task();
  w.task = task;
  auto matches = [&w, &task] {
    return !w.idle() && task.restart_epoch() == w.epoch && task.job().size() == w.job_id.size() + 5 &&
           task.job().compare(5, std::string::npos, w.job_id) == 0;
  };
  if (matches()) {
    HandleTaskLocked(w, task);
    ScheduleLocked();
  }
  ::recfleet::v1::HeartbeatResponse out;
  ToProto(w.lease_expiry, out.mutable_lease_expire_time());
  if (!matches()) {
    if (TaskActive(task)) {
      auto* abort = out.add_commands()->mutable_abort();
      abort->set_job(task.job());
      abort->set_restart_epoch(task.restart_epoch());
      abort->set_reason("NotAssigned");
    }
    if (!w.idle()) {
      ActiveJob& aj = jobs_.at(w.job_id);
      if (aj.job.status().state() == JobStatus::SCHEDULING) {
        *out.add_commands()->mutable_assignment() = AssignmentLocked(w, aj);
      } else if (aj.started.count(w.id) && task.phase() != TaskStatus::SUCCEEDED) {
        // RUNNING, but this worker no longer runs its task: the gang is broken.
        FailAttemptLocked(aj, "WorkerLostTask",
                          absl::StrCat("worker ", w.id, " (", w.info.host(),
                                       ") reports no task for the job"));
      }
    }
  }
  return out;
}

}  // namespace recfleet::coordinator
