#ifndef RECFLEET_PLANNER_CANDIDATES_H_
#define RECFLEET_PLANNER_CANDIDATES_H_

// Planner stage 1: the dense meshes and sparse layouts worth costing.
// Internal to the planner (planner.h is the public entry point).
//
// Group sizes tile the fleet and nest with its domains (a group inside an
// NVLink domain divides it; a larger group is whole domains inside a zone;
// a larger one still is whole zones). Unless the job allows otherwise, no
// FSDP, model-parallel or V3 group crosses a zone: only gradient
// all-reduce may.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/sharding.h"
#include "planner/topology.h"

namespace recfleet::planner {

struct DenseOption {
  int fsdp_group = 1;
  std::vector<int> ep;  // Per module; 1 for non-expert modules or no EP.
};

struct SparseOption {
  SparseScheme scheme = SparseScheme::kV2;
  int m = 1;  // Model-parallel group size.
  int s = 1;  // V3 shard degree.
  absl::StatusOr<ShardingResult> sharding = absl::UnknownError("not sharded");
  // Busiest-rank figures of the sharding (see Summarize).
  double emb_max = 0, out_max = 0, out_mean = 0, ids_max = 0, touched_max = 0;
  double compute_max = 0, largest_touched_table = 0;

  std::string Label() const;
  // Fills the busiest-rank figures from `sharding` (which must be ok).
  void Summarize();
};

// Group sizes up to max_size that tile the fleet and nest with its domains.
std::vector<int> GroupSizes(const Topology& topology, int max_size);

// FSDP group sizes, each with every combination of EP degrees for the
// expert modules (powers of two inside one NVLink domain dividing both the
// expert count and the group). Above 256 combinations per group size, all
// expert modules take the same degree.
std::vector<DenseOption> EnumerateDense(const Topology& topology, const Model& model,
                                        const PlannerOptions& options);
// The options of one FSDP group size (which must be one of GroupSizes).
std::vector<DenseOption> EnumerateDenseGroup(const Topology& topology, const Model& model,
                                             int fsdp_group);

// V2 groups up to options.max_model_parallel_group, V1 over the fleet, and
// V3 with shard degrees inside an NVLink domain. Not yet sharded.
std::vector<SparseOption> EnumerateSparse(const Topology& topology, const PlannerOptions& options);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_CANDIDATES_H_
