#ifndef RECFLEET_SERVICES_COORDINATOR_COORDINATOR_H_
#define RECFLEET_SERVICES_COORDINATOR_COORDINATOR_H_

// The coordinator's domain logic, free of transport: the job API (create,
// get, list, cancel, watch), the worker API (register, heartbeat, step
// reports, rendezvous) and the control loop that expires leases, restarts
// jobs whose workers were lost and gang-schedules queued jobs. The gRPC
// services (job_service.h, worker_service.h) are thin adapters over it.
//
// Job records and transitions are persisted in a JobStore before a call
// returns; on start-up the coordinator recovers every non-terminal job from
// it (see Create). Worker leases and rendezvous keys are soft state.
//
// Thread-safe: one mutex serializes the domain state; store writes happen
// under it, so transitions are recorded in the order they occur. Nothing
// under it reads a dataset: what a plan needs from a job's data is read once
// per job before the mutex is taken (CoordinatorOptions.planning_data_reader)
// and kept with the job for every placement.
//
// The implementation is split by concern, all over the same state:
//   coordinator.cc             construction, recovery, metrics, control loop
//   coordinator_jobs.cc        job lifecycle: create/get/list/cancel and state
//                              transitions, attempt failure and restarts
//   coordinator_scheduling.cc  gang scheduling, placement, assignments, PlanJob
//   coordinator_workers.cc     register, heartbeat, task reports
//   coordinator_progress.cc    step reports -> JobProgress (ProgressAggregator)
//   coordinator_watch.cc       the WatchJob event stream (JobEventLog)
//   coordinator_rendezvous.cc  the rendezvous key-value API

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "recfleet/v1/job_service.pb.h"
#include "recfleet/v1/worker_service.pb.h"
#include "services/common/metrics.h"
#include "services/coordinator/gang_scheduler.h"
#include "services/coordinator/job_event_log.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/plan_adapter.h"
#include "services/coordinator/progress_aggregator.h"
#include "services/coordinator/rendezvous.h"
#include "services/coordinator/status_page.h"
#include "services/coordinator/worker_registry.h"

namespace recfleet::coordinator {

struct CoordinatorOptions {
  // A worker whose heartbeats stop for this long is lost.
  absl::Duration lease = absl::Seconds(10);
  // Heartbeat period told to workers; zero = lease / 3.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // Per job, aggregated progress is persisted and streamed to watchers at
  // most this often.
  absl::Duration progress_interval = absl::Seconds(1);
  // Restarts allowed when spec.training.max_restarts is 0.
  int default_max_restarts = 3;
  // Events kept per job for WatchJob; a watcher further behind gets a fresh
  // snapshot instead of the missed events.
  int watch_buffer = 256;
  // Data-loader endpoint put into assignments ("" = workers read directly).
  std::string loader_address;
  // The secret shared with the data loaders; when set, every assignment
  // carries the grant of its job's DataConfig (services/common/data_grant.h),
  // without which such a loader serves no data. "" = no grants.
  std::string data_grant_key;
  // Speeds and sizes of the workers' GPUs, which topology labels do not
  // carry; used by PlanJob and the default group planner.
  planner::Topology planner_hardware = DefaultHardware();
  // Measured rate tables of the engine (engine/step_rates.h), at most one
  // per device: the planner prices each job's GEM-lite with the one of its
  // device (RatesForJob). Empty: the planner's shape estimates.
  std::vector<engine::StepRates> step_rates;
  // Where relative dataset paths of specs resolve for planning (the
  // loaders' and workers' --data_root); "" = the working directory.
  std::string data_root;
  // What a job's plans read from its dataset (plan_adapter.h PlanningData),
  // given the spec as submitted. Called once per job outside the scheduler's
  // lock: by CreateJob before it takes the lock, and on start-up for every
  // recovered job before the lock is taken and RPCs are served. Unset:
  // PlanningDatasetReader(step_rates, data_root). CreateJob and PlanJob
  // return the reader's error and create nothing (a retried CreateJob of a
  // job created before its data broke returns that job); a recovered job
  // whose data can no longer be read fails as one the planner cannot fit:
  // when it is placed, with reason "PlanFailed" and the reader's message
  // (the job state machine has no QUEUED -> FAILED).
  PlanningDataReader planning_data_reader;
  // Communication groups for an assignment from a job's PlanningData, called
  // under the lock (no file I/O). Unset: every job is planned on its
  // placement with the planner (PlanningDataGroupPlanner(planner_hardware,
  // step_rates, data_root)); a job the planner cannot fit fails with reason
  // "PlanFailed" and the planner's message.
  DataGroupPlanner group_planner;
  // Time source (tests substitute a manual clock).
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

class Coordinator {
 public:
  // Recovers active jobs from `store`: QUEUED and RESTARTING jobs wait for
  // workers again; SCHEDULING jobs go back to QUEUED (their rendezvous keys
  // were in memory); RUNNING jobs keep running if every worker re-registers
  // under its old id within one lease, else they restart. Metrics are
  // registered on `registry` (which must outlive the coordinator).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(std::unique_ptr<JobStore> store,
                                                             CoordinatorOptions options,
                                                             metrics::MetricRegistry* registry);
  ~Coordinator();  // Calls Shutdown().

  // Stops the control loop, ends pending rendezvous waits (UNAVAILABLE) and
  // wakes watchers, so a server can drain its calls. Idempotent.
  void Shutdown();

  // ---- JobService (see job_service.proto for contracts and errors) ----
  absl::StatusOr<::recfleet::v1::Job> CreateJob(const ::recfleet::v1::CreateJobRequest& request);
  absl::StatusOr<::recfleet::v1::Job> GetJob(const ::recfleet::v1::GetJobRequest& request);
  absl::StatusOr<::recfleet::v1::ListJobsResponse> ListJobs(
      const ::recfleet::v1::ListJobsRequest& request);
  absl::StatusOr<::recfleet::v1::Job> CancelJob(const ::recfleet::v1::CancelJobRequest& request);
  absl::Status DeleteJob(const ::recfleet::v1::DeleteJobRequest& request);
  // Reads the dataset and plans outside the lock: the planner may take a
  // while on large fleets.
  absl::StatusOr<::recfleet::v1::PlanJobResponse> PlanJob(
      const ::recfleet::v1::PlanJobRequest& request);

  // The read-only status page (status_page.h) of the newest 100 jobs, with
  // the progress curves recorded since this coordinator started.
  std::string StatusPage();

  // WatchJob in two calls: the current job plus the sequence number of its
  // latest event, then the events after a sequence number. WaitJobEvents
  // blocks until at least one event exists or `deadline` passes (then it
  // returns none). A caller that fell more than watch_buffer events behind
  // gets one SNAPSHOT event instead of the missed ones. UNAVAILABLE once
  // Shutdown() has been called.
  using JobEvent = JobEventLog::Event;
  absl::StatusOr<JobEvent> WatchSnapshot(const std::string& name);
  absl::StatusOr<std::vector<JobEvent>> WaitJobEvents(const std::string& name, int64_t after,
                                                      absl::Time deadline);
  absl::StatusOr<::recfleet::v1::ListJobEventsResponse> ListJobEvents(
      const ::recfleet::v1::ListJobEventsRequest& request);

  // ---- WorkerService (see worker_service.proto) ----
  absl::StatusOr<::recfleet::v1::RegisterWorkerResponse> RegisterWorker(
      const ::recfleet::v1::RegisterWorkerRequest& request);
  absl::StatusOr<::recfleet::v1::HeartbeatResponse> Heartbeat(
      const ::recfleet::v1::HeartbeatRequest& request);
  absl::StatusOr<::recfleet::v1::ReportStepResponse> ReportStep(
      const ::recfleet::v1::ReportStepRequest& request);
  absl::Status KvSet(const ::recfleet::v1::KvSetRequest& request);
  absl::StatusOr<::recfleet::v1::KvGetResponse> KvGet(const ::recfleet::v1::KvGetRequest& request);
  ::recfleet::v1::ListWorkersResponse ListWorkers();
  // Calls `done` exactly once, possibly on another thread.
  void KvWait(const ::recfleet::v1::KvWaitRequest& request,
              std::function<void(absl::StatusOr<::recfleet::v1::KvWaitResponse>)> done);

  // One pass of the control loop: expire leases (restarting the jobs of lost
  // workers), give up on workers that did not re-register after a restart,
  // place queued jobs, flush progress. StartLoop runs it every `interval`;
  // tests call it directly.
  void Tick();
  void StartLoop(absl::Duration interval);

  // Workers that missed their lease so far (for tests and metrics).
  int64_t expired_leases() const;

 private:
  // A job that is not terminal.
  struct ActiveJob {
    std::string id;
    uint64_t order = 0;  // Scheduling order (creation order).
    ::recfleet::v1::Job job;
    int ranks_per_worker = 1;
    std::vector<::recfleet::v1::ProcessGroup> groups;
    std::optional<::recfleet::v1::Plan> plan;  // Of this attempt's groups.
    // What every placement of the job is planned from (read outside mu_),
    // or why it could not be read.
    absl::StatusOr<PlanningData> planning_data =
        absl::FailedPreconditionError("the job's dataset was not read for planning");
    std::set<std::string> started;  // Workers that reported RUNNING this epoch.
    ProgressAggregator progress;  // This attempt's step reports.
    // Rank 0 claimed SUCCEEDED before its step reports reached the last
    // step (logged once per job).
    bool early_success_logged = false;
    // Restarts and failed starts so far (spec.training.max_restarts bounds
    // both), and no new placement before `not_before` after a failed start.
    int restarts = 0;
    absl::Time not_before = absl::InfinitePast();
    bool progress_dirty = false;
    absl::Time last_publish = absl::InfinitePast();
    // After a coordinator restart: workers must re-register before this.
    absl::Time relink_deadline = absl::InfinitePast();
  };

  Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
              metrics::MetricRegistry* registry);
  absl::Status Recover();

  absl::Status TransitionLocked(ActiveJob& aj, JobState to, const std::string& reason,
                                const std::string& message,
                                const std::function<void(::recfleet::v1::JobStatus&)>& mutate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the job to a terminal state and forgets it; `aj` is invalid after.
  absl::Status EndJobLocked(ActiveJob& aj, JobState to, const std::string& reason,
                            const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current attempt failed (worker lost or task failed): back to QUEUED,
  // RESTARTING, or FAILED when the restart budget is spent.
  void FailAttemptLocked(ActiveJob& aj, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorkersLocked(ActiveJob& aj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceLocked(ActiveJob& aj, const Placement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleTaskLocked(WorkerRecord& w, const ::recfleet::v1::TaskStatus& task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ::recfleet::v1::Assignment AssignmentLocked(const WorkerRecord& w, const ActiveJob& aj) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ComputeProgressLocked(ActiveJob& aj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishProgressLocked(ActiveJob& aj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitLocked(const std::string& id, ::recfleet::v1::WatchJobResponse event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<::recfleet::v1::Job> LoadJobLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int MaxRestarts(const ActiveJob& aj) const;
  // A rendezvous call must come from a registered worker presenting its
  // credential and assigned to `job` ("jobs/{id}"). Takes mu_; the
  // rendezvous itself is called without it.
  absl::Status AuthorizeKv(const std::string& worker_id, const std::string& credential,
                           const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  void RegisterMetrics(metrics::MetricRegistry* registry);

  const CoordinatorOptions options_;
  std::unique_ptr<JobStore> store_;
  Rendezvous rendezvous_;

  mutable absl::Mutex mu_;
  absl::CondVar events_cv_;
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ActiveJob> jobs_ ABSL_GUARDED_BY(mu_);
  // QUEUED and RESTARTING jobs as (order, id): the scheduler's queue.
  std::set<std::pair<uint64_t, std::string>> waiting_ ABSL_GUARDED_BY(mu_);
  JobEventLog events_ ABSL_GUARDED_BY(mu_);
  // Progress curves for the status page by job name, the oldest-created
  // first in history_order_ (at most kMaxHistories jobs kept).
  static constexpr size_t kMaxHistories = 200;
  std::map<std::string, ProgressHistory> history_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> history_order_ ABSL_GUARDED_BY(mu_);
  // Worker id -> job id, for RUNNING jobs recovered after a restart whose
  // workers have not re-registered yet.
  std::map<std::string, std::string> pending_relink_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool schedule_dirty_ ABSL_GUARDED_BY(mu_) = true;
  int64_t expired_leases_ ABSL_GUARDED_BY(mu_) = 0;

  // Metrics (owned by the registry).
  metrics::Counter* jobs_created_ = nullptr;
  metrics::Family<metrics::Counter>* transitions_ = nullptr;
  metrics::Counter* registrations_ = nullptr;
  metrics::Counter* lease_expirations_ = nullptr;
  metrics::Counter* step_reports_ = nullptr;

  absl::Notification stop_;
  std::thread loop_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_COORDINATOR_H_
