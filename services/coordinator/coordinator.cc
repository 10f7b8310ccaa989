#include "services/coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/coordinator/job_state.h"
#include "services/coordinator/spec_validation.h"
#include "services/coordinator/time_util.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::JobTransition;

namespace {

// Event logs of finished jobs are kept this long for late watchers.
constexpr absl::Duration kEndedLogRetention = absl::Minutes(10);

CoordinatorOptions WithGroupPlanner(CoordinatorOptions options) {
  if (!options.planning_data_reader) {
    options.planning_data_reader = PlanningDatasetReader(options.step_rates, options.data_root);
  }
  if (!options.group_planner) {
    options.group_planner =
        PlanningDataGroupPlanner(options.planner_hardware, options.step_rates, options.data_root);
  }
  return options;
}

}  // namespace

Coordinator::Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
                         metrics::MetricRegistry* registry)
    : options_(WithGroupPlanner(std::move(options))),
      store_(std::move(store)),
      registry_(options_.lease),
      events_(options_.watch_buffer) {
  RegisterMetrics(registry);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    std::unique_ptr<JobStore> store, CoordinatorOptions options,
    metrics::MetricRegistry* registry) {
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease must be > 0, got ", absl::FormatDuration(options.lease)));
  }
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(store), std::move(options), registry));
  if (absl::Status s = c->Recover(); !s.ok()) return s;
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_.HasBeenNotified()) stop_.Notify();
    events_cv_.SignalAll();
  }
  if (loop_.joinable()) loop_.join();
  rendezvous_.Shutdown();
}

void Coordinator::RegisterMetrics(metrics::MetricRegistry* registry) {
  jobs_created_ = &registry->AddCounter("recfleet_jobs_created_total", "Jobs created.").Get();
  transitions_ = &registry->AddCounter("recfleet_job_transitions_total",
                                       "Job state transitions by target state.", {"to"});
  registrations_ =
      &registry->AddCounter("recfleet_worker_registrations_total", "RegisterWorker calls accepted.")
           .Get();
  lease_expirations_ = &registry->AddCounter("recfleet_worker_lease_expirations_total",
                                             "Workers lost because their lease ran out.")
                            .Get();
  step_reports_ =
      &registry->AddCounter("recfleet_step_reports_total", "Per-rank training steps reported.")
           .Get();
  auto* jobs = &registry->AddGauge("recfleet_jobs", "Jobs by state.", {"state"});
  auto* workers = &registry->AddGauge("recfleet_workers", "Live workers by state.", {"state"});
  auto* keys = &registry->AddGauge("recfleet_rendezvous_keys", "Keys in the rendezvous store.");
  registry->AddCollector([this, jobs, workers, keys] {
    absl::StatusOr<std::vector<std::pair<JobState, int64_t>>> counts = store_->CountByState();
    if (counts.ok()) {
      for (const auto& [state, n] : *counts) jobs->WithLabels({StateName(state)}).Set(n);
    }
    {
      absl::MutexLock lock(&mu_);
      int64_t idle = registry_.idle_count();
      workers->WithLabels({"idle"}).Set(idle);
      workers->WithLabels({"assigned"}).Set(registry_.workers().size() - idle);
    }
    keys->Get().Set(rendezvous_.key_count());
  });
}

absl::Status Coordinator::Recover() {
  absl::StatusOr<std::vector<Job>> active = store_->ActiveJobs();
  if (!active.ok()) return active.status();
  // Every active job may need a plan (RUNNING ones when they restart): read
  // their data before taking the lock, and before the lease clock starts.
  std::vector<absl::StatusOr<PlanningData>> planning_data;
  for (const Job& job : *active) planning_data.push_back(options_.planning_data_reader(job.spec()));
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  for (size_t i = 0; i < active->size(); ++i) {
    Job& job = (*active)[i];
    absl::StatusOr<std::string> id = ParseJobName(job.name(), "stored job name");
    if (!id.ok()) return id.status();
    absl::StatusOr<std::vector<JobTransition>> history = store_->Transitions(*id);
    if (!history.ok()) return history.status();
    ActiveJob& aj = jobs_[*id];
    aj.id = *id;
    aj.order = next_order_++;
    aj.job = std::move(job);
    aj.planning_data = std::move(planning_data[i]);
    aj.ranks_per_worker = std::max(aj.job.spec().resources().gpus_per_worker(), 1);
    for (const JobTransition& t : *history) aj.restarts += t.to() == JobStatus::RESTARTING;
    const JobState state = aj.job.status().state();
    if (state == JobStatus::QUEUED || state == JobStatus::RESTARTING) {
      waiting_.insert({aj.order, aj.id});
    } else if (state == JobStatus::SCHEDULING) {
      FailAttemptLocked(aj, "CoordinatorRestarted",
                        "the coordinator restarted while the job was being placed");
    } else if (state == JobStatus::RUNNING) {
      aj.relink_deadline = now + options_.lease;
      // Every rank reached at least the job-level step persisted last, so a
      // rank whose final reports landed before the restart can still
      // complete the job.
      aj.progress.Reset(WorldSize(aj.job.spec()), aj.job.status().progress().step());
      for (const std::string& w : aj.job.status().workers()) {
        pending_relink_[w] = aj.id;
        aj.started.insert(w);
      }
      rendezvous_.Open(aj.job.name(), aj.job.status().restart_epoch());
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Control loop
// ---------------------------------------------------------------------------

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  for (WorkerRecord& w : registry_.Expire(now)) {
    ++expired_leases_;
    lease_expirations_->Increment();
    auto it = jobs_.find(w.job_id);
    if (!w.idle() && it != jobs_.end()) {
      FailAttemptLocked(it->second, "WorkerLost",
                        absl::StrCat("worker ", w.id, " (", w.info.host(), ") missed its lease of ",
                                     absl::FormatDuration(options_.lease)));
    }
    schedule_dirty_ = true;
  }
  // RUNNING jobs recovered after a restart whose workers did not come back.
  std::vector<std::string> abandoned;
  for (auto& [id, aj] : jobs_) {
    if (aj.relink_deadline == absl::InfinitePast() || aj.relink_deadline > now) continue;
    aj.relink_deadline = absl::InfinitePast();
    for (const std::string& w : aj.job.status().workers()) {
      if (pending_relink_.erase(w) > 0) abandoned.push_back(id);
    }
  }
  for (const std::string& id : abandoned) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && it->second.job.status().state() == JobStatus::RUNNING) {
      FailAttemptLocked(it->second, "WorkerLost",
                        "a worker did not re-register after the coordinator restarted");
    }
  }
  ScheduleLocked();
  for (auto& [id, aj] : jobs_) {
    if (aj.progress_dirty && now - aj.last_publish >= options_.progress_interval) {
      PublishProgressLocked(aj);
    }
  }
  events_.DropEndedBefore(now - kEndedLogRetention);
}

void Coordinator::StartLoop(absl::Duration interval) {
  loop_ = std::thread([this, interval] {
    while (!stop_.WaitForNotificationWithTimeout(interval)) Tick();
  });
}

int64_t Coordinator::expired_leases() const {
  absl::MutexLock lock(&mu_);
  return expired_leases_;
}

}  // namespace recfleet::coordinator
