#include "services/coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/job_model.h"
#include "services/coordinator/job_state.h"
#include "services/coordinator/planner/report.h"
#include "services/coordinator/spec_validation.h"
#include "services/coordinator/time_util.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Assignment;
using ::recfleet::v1::Job;
using ::recfleet::v1::JobProgress;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::JobTransition;
using ::recfleet::v1::TaskStatus;
using ::recfleet::v1::WatchJobResponse;

namespace {

// Steps per rank kept for throughput and straggler statistics.
constexpr size_t kRecentSteps = 16;
// Event logs of finished jobs are kept this long for late watchers.
constexpr absl::Duration kEndedLogRetention = absl::Minutes(10);
constexpr absl::Duration kMaxKvWait = absl::Seconds(300);
constexpr absl::Duration kDefaultKvWait = absl::Seconds(30);

bool TaskActive(const TaskStatus& t) {
  return t.phase() == TaskStatus::STARTING || t.phase() == TaskStatus::RUNNING;
}

CoordinatorOptions WithGroupPlanner(CoordinatorOptions options) {
  if (!options.group_planner) {
    options.group_planner = PlanningGroupPlanner(options.planner_hardware);
  }
  return options;
}

}  // namespace

Coordinator::Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
                         metrics::MetricRegistry* registry)
    : options_(WithGroupPlanner(std::move(options))),
      store_(std::move(store)),
      registry_(options_.lease) {
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
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  for (Job& job : *active) {
    absl::StatusOr<std::string> id = ParseJobName(job.name(), "stored job name");
    if (!id.ok()) return id.status();
    absl::StatusOr<std::vector<JobTransition>> history = store_->Transitions(*id);
    if (!history.ok()) return history.status();
    ActiveJob& aj = jobs_[*id];
    aj.id = *id;
    aj.order = next_order_++;
    aj.job = std::move(job);
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
      aj.ranks.resize(WorldSize(aj.job.spec()));
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
  events_[aj.id].ended = options_.clock();
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
        if (!s.ok()) std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
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
    if (!s.ok()) std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
    return;  // `aj` is gone.
  } else {
    return;  // QUEUED / RESTARTING hold no workers.
  }
  if (!s.ok()) {
    // The store refused the write; the job keeps its state and the next
    // failure report or lease sweep retries.
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
    return;
  }
  ReleaseWorkersLocked(aj);
  rendezvous_.Close(aj.job.name());
}

// ---------------------------------------------------------------------------
// Scheduling
// ---------------------------------------------------------------------------

void Coordinator::ScheduleLocked() {
  if (!schedule_dirty_) return;
  schedule_dirty_ = false;
  if (waiting_.empty()) return;
  std::vector<WorkerView> idle;
  for (const auto& [id, w] : registry_.workers()) {
    if (w.idle()) idle.push_back(WorkerView{id, w.gpu_count(), w.info.topology()});
  }
  // First fit in submission order: a job that does not fit yet does not
  // block smaller jobs behind it. Placing a job removes only its own entry
  // from waiting_, which the loop has already stepped past.
  for (auto it = waiting_.begin(); it != waiting_.end() && !idle.empty();) {
    ActiveJob* aj = &jobs_.at((it++)->second);
    if (aj->not_before > options_.clock()) {
      schedule_dirty_ = true;  // Backing off after a failed start: retry on a later tick.
      continue;
    }
    if (static_cast<size_t>(aj->job.spec().resources().workers()) > idle.size()) continue;
    std::optional<Placement> p = PlaceGang(aj->job.spec(), idle);
    if (!p) continue;
    std::set<std::string> taken;
    for (const WorkerView& w : p->workers) taken.insert(w.id);
    idle.erase(std::remove_if(idle.begin(), idle.end(),
                              [&](const WorkerView& w) { return taken.count(w.id) > 0; }),
               idle.end());
    PlaceLocked(*aj, *p);
  }
}

void Coordinator::PlaceLocked(ActiveJob& aj, const Placement& placement) {
  const int64_t epoch = aj.job.status().restart_epoch() + 1;
  const int64_t step = aj.job.status().progress().step();
  absl::StatusOr<GroupPlan> groups = options_.group_planner(aj.job.spec(), placement);
  std::vector<std::string> ids;
  for (const WorkerView& w : placement.workers) ids.push_back(w.id);
  absl::Status s = TransitionLocked(aj, JobStatus::SCHEDULING, "GangPlaced",
                                    absl::StrCat(ids.size(), " worker(s), epoch ", epoch,
                                                 groups.ok() ? "; " + groups->summary : ""),
                                    [&](JobStatus& st) {
                                      st.set_restart_epoch(epoch);
                                      if (groups.ok()) st.set_plan_summary(groups->summary);
                                      st.clear_workers();
                                      for (const std::string& id : ids) st.add_workers(id);
                                    });
  if (!s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
    return;
  }
  if (!groups.ok()) {
    EndJobLocked(aj, JobStatus::FAILED, "PlanFailed", std::string(groups.status().message()))
        .IgnoreError();
    return;
  }
  aj.groups = std::move(groups->groups);
  aj.ranks_per_worker = placement.ranks_per_worker;
  aj.started.clear();
  // Ranks resume from the last checkpoint every rank had reached.
  std::vector<RankStats> fresh(WorldSize(aj.job.spec()));
  const int64_t every = aj.job.spec().training().checkpoint_every();
  const int64_t resume = every > 0 ? step / every * every : 0;
  for (RankStats& r : fresh) r.step = resume;
  aj.ranks = std::move(fresh);
  for (size_t i = 0; i < ids.size(); ++i) {
    WorkerRecord* w = registry_.Find(ids[i]);
    w->job_id = aj.id;
    w->rank = static_cast<int>(i) * placement.ranks_per_worker;
    w->epoch = epoch;
  }
  rendezvous_.Open(aj.job.name(), epoch);
}

Assignment Coordinator::AssignmentLocked(const WorkerRecord& w, const ActiveJob& aj) const {
  Assignment a;
  a.set_job(aj.job.name());
  *a.mutable_spec() = aj.job.spec();
  a.set_rank(w.rank);
  a.set_world_size(static_cast<int32_t>(WorldSize(aj.job.spec())));
  for (const auto& g : aj.groups) *a.add_groups() = g;
  a.set_loader_address(options_.loader_address);
  // The job's data configuration, derived from its spec here so every rank
  // (and the loader it asks) deals by the same rules. CreateJob checked the
  // spec builds.
  absl::StatusOr<::recfleet::v1::DataConfig> data =
      engine::BuildDataConfig(aj.job.spec(), aj.job.name(), a.world_size());
  if (data.ok()) *a.mutable_data() = *std::move(data);
  a.set_restart_epoch(w.epoch);
  const int64_t every = aj.job.spec().training().checkpoint_every();
  const int64_t step = aj.job.status().progress().step();
  a.set_resume_step(every > 0 ? step / every * every : 0);
  return a;
}

// ---------------------------------------------------------------------------
// JobService
// ---------------------------------------------------------------------------

absl::StatusOr<Job> Coordinator::CreateJob(const ::recfleet::v1::CreateJobRequest& request) {
  if (!request.has_spec()) {
    return absl::InvalidArgumentError("spec is required (the JobSpec to run)");
  }
  if (absl::Status s = ValidateJobSpec(request.spec()); !s.ok()) return s;
  // A well-formed spec must also be one recfleet builds: a field nothing
  // honors is rejected here, never dropped or failed at worker start.
  if (absl::Status s = engine::CheckBuildable(request.spec()); !s.ok()) return s;
  const std::string& rid = request.request_id();
  if (rid.size() > 128 || rid.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                "0123456789._-") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id must be at most 128 characters of [A-Za-z0-9._-], got \"", rid, "\""));
  }
  absl::MutexLock lock(&mu_);
  bool created = false;
  absl::StatusOr<Job> job = store_->Create(request.spec(), rid, options_.clock(), &created);
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

absl::StatusOr<::recfleet::v1::ListJobsResponse> Coordinator::ListJobs(
    const ::recfleet::v1::ListJobsRequest& request) {
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be 0..1000 (0 = 50), got ", request.page_size()));
  }
  std::set<JobState> states;
  for (int s : request.states()) {
    if (s == JobStatus::STATE_UNSPECIFIED || !JobStatus::State_IsValid(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("states must name real job states (QUEUED ... CANCELLED), got ", s));
    }
    states.insert(static_cast<JobState>(s));
  }
  absl::StatusOr<JobStore::Page> page = store_->List(
      request.page_size() == 0 ? 50 : request.page_size(), request.page_token(), states);
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

absl::StatusOr<::recfleet::v1::PlanJobResponse> Coordinator::PlanJob(
    const ::recfleet::v1::PlanJobRequest& request) {
  if (!request.has_spec()) {
    return absl::InvalidArgumentError("spec is required (the JobSpec to plan)");
  }
  const ::recfleet::v1::JobSpec& spec = request.spec();
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  std::vector<WorkerView> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, w] : registry_.workers()) {
      live.push_back(WorkerView{id, w.gpu_count(), w.info.topology()});
    }
  }
  const size_t registered = live.size();
  std::optional<Placement> placement = PlaceGang(spec, std::move(live));
  if (!placement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.resources.workers: the job needs ", spec.resources().workers(),
        " worker(s) with at least ", spec.resources().gpus_per_worker(), " GPU(s) each; ",
        registered, " worker(s) are registered"));
  }
  absl::StatusOr<planner::Plan> plan = PlanPlacement(spec, *placement, options_.planner_hardware);
  if (!plan.ok()) return plan.status();
  ::recfleet::v1::PlanJobResponse response;
  *response.mutable_plan() = PlanToProto(*plan);
  for (const WorkerView& w : placement->workers) {
    response.add_workers(absl::StrCat(w.id, " (", w.topology.zone(), "/",
                                      w.topology.nvlink_domain(), "/", w.topology.node(), ")"));
  }
  response.set_report(planner::FormatText(*plan));
  response.set_report_json(planner::FormatJson(*plan));
  return response;
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

absl::StatusOr<Coordinator::JobEvent> Coordinator::WatchSnapshot(const std::string& name) {
  absl::StatusOr<std::string> id = ParseJobName(name, "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> job = LoadJobLocked(*id);
  if (!job.ok()) return job.status();
  WatchJobResponse snapshot;
  snapshot.set_kind(WatchJobResponse::SNAPSHOT);
  *snapshot.mutable_job() = *std::move(job);
  auto log = events_.find(*id);
  return JobEvent{log == events_.end() ? 0 : log->second.last_seq, std::move(snapshot)};
}

absl::StatusOr<std::vector<Coordinator::JobEvent>> Coordinator::WaitJobEvents(
    const std::string& name, int64_t after, absl::Time deadline) {
  absl::StatusOr<std::string> id = ParseJobName(name, "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  while (true) {
    auto log = events_.find(*id);
    if (log != events_.end() && log->second.last_seq > after) {
      const std::deque<JobEvent>& events = log->second.events;
      std::vector<JobEvent> out;
      if (events.empty() || events.front().first > after + 1) {
        // The caller missed events that were dropped: resynchronize.
        absl::StatusOr<Job> job = LoadJobLocked(*id);
        if (!job.ok()) return job.status();
        WatchJobResponse snapshot;
        snapshot.set_kind(WatchJobResponse::SNAPSHOT);
        *snapshot.mutable_job() = *std::move(job);
        out.emplace_back(log->second.last_seq, std::move(snapshot));
        return out;
      }
      for (const JobEvent& e : events) {
        if (e.first > after) out.push_back(e);
      }
      return out;
    }
    if (stop_.HasBeenNotified()) {
      return absl::UnavailableError("the coordinator is shutting down; watch again later");
    }
    if (events_cv_.WaitWithDeadline(&mu_, deadline)) return std::vector<JobEvent>();
  }
}

void Coordinator::EmitLocked(const std::string& id, WatchJobResponse event) {
  EventLog& log = events_[id];
  log.events.emplace_back(++log.last_seq, std::move(event));
  while (static_cast<int>(log.events.size()) > options_.watch_buffer) log.events.pop_front();
  events_cv_.SignalAll();
}

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
  out.set_lease_seconds(absl::ToDoubleSeconds(options_.lease));
  absl::Duration hb = options_.heartbeat_interval > absl::ZeroDuration()
                          ? options_.heartbeat_interval
                          : options_.lease / 3;
  out.set_heartbeat_interval_seconds(absl::ToDoubleSeconds(hb));
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
    case TaskStatus::SUCCEEDED:
      if (w.rank != 0) break;  // Rank 0 speaks for the job.
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
  absl::StatusOr<WorkerRecord*> renewed = registry_.Renew(request.worker_id(), options_.clock());
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

absl::StatusOr<::recfleet::v1::ReportStepResponse> Coordinator::ReportStep(
    const ::recfleet::v1::ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = registry_.Find(request.worker_id());
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                            " is not registered; call RegisterWorker"));
  }
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
      request.rank() >= static_cast<int>(aj.ranks.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank must be in [", w->rank, ", ", w->rank + aj.ranks_per_worker,
                     ") for worker ", w->id, ", got ", request.rank()));
  }
  RankStats& r = aj.ranks[request.rank()];
  for (const auto& s : request.steps()) {
    if (s.step() <= r.step && r.reported) continue;  // A retried report.
    r.step = s.step();
    r.samples += s.samples();
    r.loss = s.loss();
    r.reported = true;
    r.recent.push_back(s);
    if (r.recent.size() > kRecentSteps) r.recent.pop_front();
    step_reports_->Increment();
  }
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
  int64_t min_step = -1, samples = 0;
  double loss_sum = 0, window_samples = 0, max_seconds = 0;
  double step_sum = 0, wait_sum = 0, compute_sum = 0, comm_sum = 0, max_mean = 0;
  int reported = 0, timed = 0, slowest = 0;
  for (size_t rank = 0; rank < aj.ranks.size(); ++rank) {
    const RankStats& r = aj.ranks[rank];
    min_step = min_step < 0 ? r.step : std::min(min_step, r.step);
    samples += r.samples;
    if (!r.reported) continue;
    ++reported;
    loss_sum += r.loss;
    if (r.recent.empty()) continue;
    double seconds = 0, wait = 0, compute = 0, comm = 0, n = r.recent.size();
    for (const auto& s : r.recent) {
      seconds += s.step_seconds();
      wait += s.data_wait_seconds();
      compute += s.compute_seconds();
      comm += s.comm_seconds();
      window_samples += s.samples();
    }
    max_seconds = std::max(max_seconds, seconds);
    const double mean = seconds / n;
    if (mean > max_mean) {
      max_mean = mean;
      slowest = static_cast<int>(rank);
    }
    step_sum += mean;
    wait_sum += wait / n;
    compute_sum += compute / n;
    comm_sum += comm / n;
    ++timed;
  }
  // Samples already counted before a restart stay counted.
  if (samples > 0 || reported > 0) {
    p->set_step(std::max<int64_t>(min_step, 0));
    p->set_samples(std::max(p->samples(), samples));
  }
  if (reported > 0) p->set_loss(loss_sum / reported);
  if (timed > 0) {
    // Synchronous training: the job moves at the pace of its slowest rank.
    p->set_samples_per_second(max_seconds > 0 ? window_samples / max_seconds : 0);
    const double mean = step_sum / timed;
    p->set_slowest_rank(slowest);
    p->set_straggler_gap(mean > 0 ? max_mean / mean - 1 : 0);
    p->set_step_seconds(mean);
    p->set_data_wait_seconds(wait_sum / timed);
    p->set_compute_seconds(compute_sum / timed);
    p->set_comm_seconds(comm_sum / timed);
  }
  ToProto(options_.clock(), p->mutable_update_time());
}

void Coordinator::PublishProgressLocked(ActiveJob& aj) {
  ComputeProgressLocked(aj);
  aj.progress_dirty = false;
  aj.last_publish = options_.clock();
  *aj.job.mutable_status()->mutable_update_time() = aj.job.status().progress().update_time();
  if (absl::Status s = store_->SaveStatus(aj.id, aj.job.status()); !s.ok()) {
    std::fprintf(stderr, "coordinator: saving progress of %s: %s\n", aj.job.name().c_str(),
                 std::string(s.message()).c_str());
  }
  WatchJobResponse event;
  event.set_kind(WatchJobResponse::PROGRESS);
  *event.mutable_job() = aj.job;
  EmitLocked(aj.id, std::move(event));
}

absl::Status Coordinator::KvSet(const ::recfleet::v1::KvSetRequest& request) {
  return rendezvous_.Set(request.job(), request.restart_epoch(), request.key(), request.value());
}

absl::StatusOr<::recfleet::v1::KvGetResponse> Coordinator::KvGet(
    const ::recfleet::v1::KvGetRequest& request) {
  absl::StatusOr<std::string> v =
      rendezvous_.Get(request.job(), request.restart_epoch(), request.key());
  if (!v.ok()) return v.status();
  ::recfleet::v1::KvGetResponse out;
  out.set_value(*std::move(v));
  return out;
}

void Coordinator::KvWait(
    const ::recfleet::v1::KvWaitRequest& request,
    std::function<void(absl::StatusOr<::recfleet::v1::KvWaitResponse>)> done) {
  absl::Duration timeout = FromProto(request.timeout());
  if (timeout < absl::ZeroDuration() || timeout > kMaxKvWait) {
    done(absl::InvalidArgumentError(absl::StrCat("timeout must be in [0s, 300s] (0 = 30s), got ",
                                                 absl::FormatDuration(timeout))));
    return;
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultKvWait;
  std::vector<std::string> keys(request.keys().begin(), request.keys().end());
  rendezvous_.Wait(request.job(), request.restart_epoch(), keys, absl::Now() + timeout,
                   [keys, done = std::move(done)](absl::StatusOr<std::vector<std::string>> r) {
                     if (!r.ok()) {
                       done(r.status());
                       return;
                     }
                     ::recfleet::v1::KvWaitResponse out;
                     for (size_t i = 0; i < keys.size(); ++i) {
                       auto* kv = out.add_values();
                       kv->set_key(keys[i]);
                       kv->set_value((*r)[i]);
                     }
                     done(std::move(out));
                   });
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
  for (auto it = events_.begin(); it != events_.end();) {
    if (now - it->second.ended > kEndedLogRetention) {
      it = events_.erase(it);
    } else {
      ++it;
    }
  }
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
