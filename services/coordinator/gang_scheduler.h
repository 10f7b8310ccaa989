#ifndef RECFLEET_SERVICES_COORDINATOR_GANG_SCHEDULER_H_
#define RECFLEET_SERVICES_COORDINATOR_GANG_SCHEDULER_H_

// Gang placement: a job starts only when all of its workers can start at
// once. PlaceGang picks spec.resources.workers idle workers that each own at
// least gpus_per_worker GPUs, preferring to keep the gang inside one NVLink
// domain (then one zone), and orders them so consecutive ranks share a node
// and domain (ring/tree collectives then cross slow links least).
//
// Pure functions; thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recfleet/v1/job.pb.h"
#include "recfleet/v1/worker_service.pb.h"

namespace recfleet::coordinator {

// An idle worker as the scheduler sees it.
struct WorkerView {
  std::string id;
  int gpus = 0;
  ::recfleet::v1::Topology topology;
  // RegisterWorkerRequest.resident_memory_bytes: what the worker process
  // holds before any job (0 = not reported).
  int64_t resident_memory_bytes = 0;
};

struct Placement {
  // Chosen workers in rank order: worker i runs ranks
  // [i * ranks_per_worker, (i + 1) * ranks_per_worker).
  std::vector<WorkerView> workers;
  int ranks_per_worker = 1;
};

// nullopt when fewer than spec.resources.workers suitable workers are idle.
std::optional<Placement> PlaceGang(const ::recfleet::v1::JobSpec& spec,
                                   std::vector<WorkerView> idle);

// Communication groups handed to every rank with its assignment, and a
// one-line summary of how they were chosen (recorded in JobStatus.message).
struct GroupPlan {
  std::vector<::recfleet::v1::ProcessGroup> groups;
  std::string summary;
  // The plan the groups come from, handed to every rank (table placements);
  // unset without a planner.
  std::optional<::recfleet::v1::Plan> plan;
  // The peak memory a rank will measure (StepStats.peak_memory_bytes), bytes;
  // 0 = not predicted. A GPU job's is the plan's; the planner's memory model
  // is a GPU's, so a CPU job's comes from a CPU rate table with measured
  // memory terms (CpuRankPeakBytes in plan_adapter.h).
  double predicted_peak_bytes = 0;
};

// Decides a placed job's groups. The coordinator's default plans the job
// with the planner (plan_adapter.h); an error fails the job with its message.
using GroupPlanner = std::function<absl::StatusOr<GroupPlan>(
    const ::recfleet::v1::JobSpec& spec, const Placement& placement)>;

// Groups without a planner: "world" (all ranks) plus "node/<name>" for the
// ranks on each named node.
absl::StatusOr<GroupPlan> DefaultGroups(const ::recfleet::v1::JobSpec& spec,
                                        const Placement& placement);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_GANG_SCHEDULER_H_
