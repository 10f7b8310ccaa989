#include "services/coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/job_model.h"
#include "planner/report.h"
#include "services/common/data_grant.h"
#include "services/coordinator/spec_validation.h"
#include "spdlog/spdlog.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Assignment;
using ::recfleet::v1::JobStatus;

// ---------------------------------------------------------------------------
// Scheduling
// ---------------------------------------------------------------------------

void Coordinator::ScheduleLocked() {
  if (!schedule_dirty_) return;
  schedule_dirty_ = false;
  if (waiting_.empty()) return;
  std::vector<WorkerView> idle;
  for (const auto& [id, w] : registry_.workers()) {
    if (w.idle()) idle.push_back(WorkerView{id, w.gpu_count(), w.info.topology(), w.info.resident_memory_bytes()});
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
  // Planned from the data read when the job was created or recovered: no
  // file I/O under the lock.
  absl::StatusOr<GroupPlan> groups =
      aj.planning_data.ok() ? options_.group_planner(aj.job.spec(), placement, *aj.planning_data)
                            : absl::StatusOr<GroupPlan>(aj.planning_data.status());
  std::vector<std::string> ids;
  for (const WorkerView& w : placement.workers) ids.push_back(w.id);
  absl::Status s = TransitionLocked(aj, JobStatus::SCHEDULING, "GangPlaced",
                                    absl::StrCat(ids.size(), " worker(s), epoch ", epoch,
                                                 groups.ok() ? "; " + groups->summary : ""),
                                    [&](JobStatus& st) {
                                      st.set_restart_epoch(epoch);
                                      if (groups.ok()) st.set_plan_summary(groups->summary);
                                      if (groups.ok() && groups->plan.has_value()) {
                                        st.set_predicted_step_seconds(groups->plan->step().total_seconds());
                                        st.set_predicted_peak_memory_bytes(
                                            static_cast<int64_t>(groups->predicted_peak_bytes));
                                      }
                                      st.clear_workers();
                                      for (const std::string& id : ids) st.add_workers(id);
                                    });
  if (!s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return;
  }
  if (!groups.ok()) {
    EndJobLocked(aj, JobStatus::FAILED, "PlanFailed", std::string(groups.status().message()))
        .IgnoreError();
    return;
  }
  aj.groups = std::move(groups->groups);
  aj.plan = std::move(groups->plan);
  aj.ranks_per_worker = placement.ranks_per_worker;
  aj.started.clear();
  // Ranks resume from the last checkpoint every rank had reached.
  const int64_t every = aj.job.spec().training().checkpoint_every();
  aj.progress.Reset(WorldSize(aj.job.spec()), every > 0 ? step / every * every : 0);
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
  if (aj.plan.has_value()) *a.mutable_plan() = *aj.plan;
  a.set_loader_address(options_.loader_address);
  // The job's data configuration, derived from its spec here so every rank
  // (and the loader it asks) deals by the same rules. CreateJob checked the
  // spec builds.
  absl::StatusOr<::recfleet::v1::DataConfig> data =
      engine::BuildDataConfig(aj.job.spec(), aj.job.name(), a.world_size());
  if (data.ok()) *a.mutable_data() = *std::move(data);
  if (!options_.data_grant_key.empty()) {
    a.set_data_grant(SignDataGrant(options_.data_grant_key, a.data()));
  }
  a.set_restart_epoch(w.epoch);
  const int64_t every = aj.job.spec().training().checkpoint_every();
  const int64_t step = aj.job.status().progress().step();
  a.set_resume_step(every > 0 ? step / every * every : 0);
  return a;
}

absl::StatusOr<::recfleet::v1::PlanJobResponse> Coordinator::PlanJob(
    const ::recfleet::v1::PlanJobRequest& request) {
  if (!request.has_spec()) {
    return absl::InvalidArgumentError("spec is required (the JobSpec to plan)");
  }
  if (absl::Status s = ValidateJobSpec(request.spec()); !s.ok()) return s;
  if (absl::Status s = CheckDatasetsUnderRoot(request.spec(), options_.data_root); !s.ok()) return s;
  const ::recfleet::v1::JobSpec spec = SpecForPlanning(request.spec(), options_.data_root);
  std::vector<WorkerView> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, w] : registry_.workers()) {
      live.push_back(WorkerView{id, w.gpu_count(), w.info.topology(), w.info.resident_memory_bytes()});
    }
  }
  const size_t registered = live.size();
  std::optional<Placement> placement = PlaceGang(spec, std::move(live));
  if (!placement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.resources.workers: the job needs ", spec.resources().workers(), " worker(s)",
        spec.resources().gpus_per_worker() > 0
            ? absl::StrCat(" with at least ", spec.resources().gpus_per_worker(), " GPU(s) each")
            : std::string(" (a CPU job: any worker)"),
        "; ", registered, " worker(s) are registered"));
  }
  // The dataset is read as for a created job, without the lock.
  absl::StatusOr<PlanningData> data = options_.planning_data_reader(request.spec());
  if (!data.ok()) return data.status();
  absl::StatusOr<planner::Plan> plan =
      PlanPlacement(spec, *placement, options_.planner_hardware, RatesForJob(spec, options_.step_rates),
                    data->counts.has_value() ? &*data->counts : nullptr);
  if (!plan.ok()) return plan.status();
  ::recfleet::v1::PlanJobResponse response;
  // The plan's memory is a GPU's; a CPU job's summary gives its rank's.
  std::optional<double> cpu_peak;
  if (spec.resources().gpus_per_worker() == 0) {
    cpu_peak = CpuJobPeakBytes(spec, *placement, RatesForJob(spec, options_.step_rates), *data);
  }
  *response.mutable_plan() = PlanToProto(*plan, cpu_peak);
  for (const WorkerView& w : placement->workers) {
    response.add_workers(absl::StrCat(w.id, " (", w.topology.zone(), "/",
                                      w.topology.nvlink_domain(), "/", w.topology.node(), ")"));
  }
  response.set_report(planner::FormatText(*plan));
  response.set_report_json(planner::FormatJson(*plan));
  return response;
}

}  // namespace recfleet::coordinator
