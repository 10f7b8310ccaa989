#ifndef RECFLEET_PLANNER_PLANNER_H_
#define RECFLEET_PLANNER_PLANNER_H_

// The planner: decides how a job spreads over the fleet (2D FSDP + expert
// parallelism for dense modules, 2D model parallelism V1/V2/V3 for
// embedding tables, activation checkpointing) and predicts per-GPU memory
// and step time, explaining every choice with the alternatives it beat.
//
// A pipeline of small stages:
//   1. enumerate dense meshes (FSDP group size, EP degree per expert module)
//      and sparse layouts (V1/V2/V3, group sizes);
//   2. shard the tables for each sparse layout (sharding.h);
//   3. estimate every (mesh, layout) pair: memory with a per-region
//      checkpoint budget, the collectives of one step with their overlap
//      windows (cost_model.h), compute and exposed communication;
//   4. keep the fastest pair that fits HBM and keeps all but gradient
//      all-reduce off cross-zone links, and explain it against the rest.
//
// Promises: a returned plan never exceeds usable HBM on any GPU; the same
// input gives the same plan; more bandwidth or less latency on any level
// never predicts a slower step (every stage but the final minimum is
// independent of link speeds, and each candidate's time is monotone in
// them). When nothing fits, the error (ResourceExhausted) names the table
// or module that is over, by how much, and what would fix it.
//
// Stateless and thread-safe.

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace recfleet::planner {

absl::StatusOr<Plan> MakePlan(const Topology& topology, const PlanRequest& request);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_PLANNER_H_
