#ifndef RECFLEET_PLANNER_PLAN_H_
#define RECFLEET_PLANNER_PLAN_H_

// The planner's output: how a job spreads over the fleet, what it costs in
// memory and time, and why. Every number the report prints is a field here,
// so the text, JSON and HTML reports and a future RPC agree by construction.

#include <array>
#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/sharding.h"
#include "planner/topology.h"

namespace recfleet::planner {

// V1: one model-parallel group over the whole fleet. V2: groups of
// mp_group ranks, each on its own data with a full copy of the tables. V3:
// V2 with every group's shards split again over v3_shard_degree groups
// inside an NVLink domain and all-gathered (touched rows) before use.
enum class SparseScheme { kV1, kV2, kV3 };
const char* SparseSchemeName(SparseScheme scheme);

struct ExpertChoice {
  std::string module;
  int ep_degree = 1;  // 1: plain FSDP.
  std::string reason;
};

struct DenseMesh {
  int fsdp_group = 1;  // G: parameters sharded over G consecutive ranks.
  int replicas = 1;    // N / G groups; shard gradients all-reduced across them.
  std::vector<ExpertChoice> experts;  // One entry per expert module.
  int MaxEpDegree() const;
};

struct SparseLayout {
  SparseScheme scheme = SparseScheme::kV2;
  int mp_group = 1;          // Ranks sharing one copy's all-to-all.
  int mp_stride = 1;         // Rank distance between members (V3: v3_shard_degree).
  int v3_shard_degree = 1;   // 1 for V1/V2.
  int num_mp_groups = 1;     // Groups on different data.
  int table_copies = 1;      // Full copies of the tables in the fleet.
  ShardingResult sharding;   // Per group position; identical in every group.
};

// One collective of the step, with the compute it hides behind.
struct CommOp {
  std::string name;
  Collective collective = Collective::kAllGather;
  bool gradient_sync = false;  // An all-reduce of gradients across replicas.
  int group_size = 1;
  int group_stride = 1;
  int highest_level = -1;
  double bytes = 0;  // As CollectiveCost takes it.
  CommCost cost;
  std::string window;  // Empty: on the critical path.
  double window_s = 0;
  double exposed_s = 0;
  std::array<double, kNumLevels> exposed_per_level = {0, 0, 0};
};

// Bytes on one GPU at its peak.
struct MemoryBreakdown {
  double embedding = 0;    // Table shards and their optimizer rows.
  double dense = 0;        // Sharded fp32 master weights.
  double optimizer = 0;    // Sharded Adam state and gradient accumulators.
  double activations = 0;  // Saved for backward, after checkpointing.
  double buffers = 0;      // Gathered weights, EP activations, all-to-all and V3 gather.
  double Total() const { return embedding + dense + optimizer + activations + buffers; }
};

// How much of a checkpoint region's activations stay resident.
struct RegionBudget {
  std::string region;
  double full_bytes = 0;      // Without checkpointing.
  double min_bytes = 0;       // Keeping only the region's input.
  double budget_bytes = 0;    // Kept after checkpointing.
  double recompute_s = 0;     // Forward work redone in backward.
  double seconds_per_gib_saved = 0;  // Why this region was (or was not) cut first.
  int units = 0;             // DenseModule::recompute_units of the region.
  int recomputed_units = 0;  // Of them, recomputed: the first ones.
};

struct StepTime {
  double sparse_compute_s = 0;  // Embedding lookups, forward + backward, busiest rank.
  double dense_compute_s = 0;   // Forward + backward.
  double recompute_s = 0;
  // The dense optimizer step over this rank's parameter shards: streams
  // master weights, shard gradients and optimizer state through memory.
  double optimizer_s = 0;
  double other_compute_s = 0;  // PlanRequest::other_compute_s.
  std::array<double, kNumLevels> exposed_s = {0, 0, 0};
  // Waiting for the slowest rank (PlanRequest::rank_sync_fraction x the
  // compute, more than one rank only); not compute.
  double rank_sync_s = 0;
  double total_s = 0;
  double model_flops = 0;  // Useful dense FLOPs per GPU per step.
  double local_mfu = 0;    // model_flops / (compute time x peak).
  double e2e_mfu = 0;      // model_flops / (step time x peak).
  double scaling_ratio = 0;  // e2e_mfu / local_mfu = compute / step.
  double ComputeS() const {
    return sparse_compute_s + dense_compute_s + optimizer_s + other_compute_s;
  }
  double ExposedS() const { return exposed_s[0] + exposed_s[1] + exposed_s[2]; }
};

struct Alternative {
  std::string option;
  bool feasible = false;
  double step_s = 0;
  double peak_bytes = 0;
  std::string note;  // Why it lost, with numbers.
};

struct Decision {
  std::string dimension;
  std::string chosen;
  std::string reason;
  std::vector<Alternative> alternatives;
};

struct Plan {
  Topology topology;
  std::string model_name;
  int world = 0;
  int local_batch = 0;
  DenseMesh dense;
  SparseLayout sparse;
  // Which ranks form each group and which links the group spans.
  std::vector<std::string> placement;
  // Per model-parallel group position (every group repeats the pattern).
  std::vector<MemoryBreakdown> rank_memory;
  MemoryBreakdown peak;  // The fullest rank.
  double hbm_usable_bytes = 0;
  std::vector<RegionBudget> checkpoint;
  std::vector<CommOp> comm;
  StepTime step;
  std::array<double, kNumLevels> traffic_bytes_per_level = {0, 0, 0};  // Per rank per step.
  std::vector<Decision> decisions;
  int candidates_evaluated = 0;
};

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_PLAN_H_
