#ifndef RECFLEET_PLANNER_ESTIMATE_H_
#define RECFLEET_PLANNER_ESTIMATE_H_

// Planner stage 3: estimate one (dense mesh, sparse layout) pair: per-GPU
// memory, the activation-checkpoint budget per region, the collectives of
// one training step with the compute each can hide behind, and the step
// time. Internal to the planner (planner.h is the public entry point).
//
// The step, per GPU, in order: sparse forward lookups, dense forward
// (module by module), dense backward (in reverse), sparse backward, the
// dense optimizer step on the rank's shards (memory-bound: elementwise
// efficiency of HBM bandwidth). Overlap
// rules:
//   - module i's FSDP all-gather is prefetched behind the forward of module
//     i-1 (the sparse lookups for i = 0) and, for backward, behind the
//     backward of module i+1 (the last module keeps its gathered weights);
//   - module i's gradient reduce-scatter and replica all-reduce run behind
//     the backward of module i-1 (the sparse backward for i = 0);
//   - the ids all-to-all and the V3 forward shard all-gather are pipelined
//     behind the previous step's dense compute; the V3 backward gather
//     behind the dense backward;
//   - EP activation collectives, embedding all-to-alls, the V3
//     reduce-scatter and the table-copy sync are on the critical path.
// With options.overlap_collectives false, every collective is on the
// critical path. Collectives sharing a window run back to back; whatever exceeds the
// window's compute is exposed, charged to each collective (and link level)
// in proportion to its time.

#include <array>
#include <string>
#include <vector>

#include "planner/candidates.h"
#include "planner/cost_model.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace recfleet::planner {

// A checkpoint region: the modules sharing a region name.
struct Region {
  std::string name;
  double full = 0;   // Activation bytes kept without checkpointing.
  double min = 0;    // Keeping only the region's input (each unit's).
  double fwd_s = 0;  // Forward time: what recomputing all of it costs.
  bool recomputable = true;
  int units = 0;     // DenseModule::recompute_units (max over the modules).
  bool after_peak = false;  // DenseModule::recompute_after_peak (all its modules).
};

// What every candidate shares, computed once per plan.
struct Context {
  const Topology& topo;
  const PlanRequest& req;
  int world = 0;
  double usable = 0;              // HBM per GPU after the reserve.
  std::vector<double> fwd_s;      // Per module, per rank.
  std::vector<Region> regions;    // Cheapest recompute per byte saved first.
  double ids_send_bytes = 0;      // Ids each rank sends per step.
  double model_flops = 0;         // Useful dense FLOPs per rank per step.
};
Context MakeContext(const Topology& topology, const PlanRequest& request);

struct Op {
  const char* what;
  int module;  // -1: not tied to a dense module.
  Collective collective;
  bool gradient_sync;
  GroupShape group;
  double bytes;
  int window;  // Index into Evaluation::windows; -1: on the critical path.
  CommCost cost;
  double exposed = 0;
  std::array<double, kNumLevels> exposed_level = {0, 0, 0};
};
std::string OpName(const Model& model, const Op& op);

struct Window {
  const char* what;
  int module;  // -1: not tied to a dense module.
  double compute_s;
};
std::string WindowName(const Model& model, const Window& window);

struct Evaluation {
  bool feasible = false;   // Fits HBM and keeps non-gradient traffic in zones.
  bool memory_ok = false;
  std::string why_not;
  double over_bytes = 0;   // Beyond usable HBM even with full checkpointing.
  MemoryBreakdown peak;    // The fullest GPU.
  double sparse_buffers = 0;
  std::vector<RegionBudget> regions;
  StepTime step;
  std::vector<Op> ops;
  std::vector<Window> windows;
};

// `sparse.sharding` must be ok.
Evaluation Evaluate(const Context& context, const DenseOption& dense, const SparseOption& sparse);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_ESTIMATE_H_
