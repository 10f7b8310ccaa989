#ifndef RECFLEET_PLANNER_COST_MODEL_H_
#define RECFLEET_PLANNER_COST_MODEL_H_

// Alpha-beta cost of the collectives the planner schedules, level by level.
//
// A group that spans several link levels runs each collective
// hierarchically (the NCCL tree/ring-of-rings shape): an all-gather first
// exchanges the small per-rank shards over the outermost level, then the
// growing pieces over each inner level, so the slow links carry the least.
// For a full (gathered) buffer of M bytes and group factors f_0..f_2
// (innermost first), level l carries
//     bytes_l = M * (f_l - 1) / (f_0 * ... * f_l)
// per rank in (f_l - 1) ring steps, each paying the level's latency:
//     time = sum_l (f_l - 1) * alpha_l + bytes_l / beta_l.
// Reduce-scatter mirrors all-gather; all-reduce is reduce-scatter plus
// all-gather. An all-to-all with a per-rank send buffer of M bytes sends
// M / size to every peer; the peers first reached at level l number
// p_l = f_0*..*f_l - f_0*..*f_(l-1), each one a message paying alpha_l:
//     time = sum_l p_l * alpha_l + (M * p_l / size) / beta_l.
// On a CPU node whose ranks outnumber its cores (Topology::ComputeShare),
// the innermost level's time grows by ranks / cores: loopback copies are
// work for the same cores.
// Levels are charged one after another (no overlap between levels), which
// keeps every formula monotone: more bandwidth or less latency on any level
// never makes a collective slower.
//
// Pure functions; thread-safe.

#include <array>

#include "planner/topology.h"

namespace recfleet::planner {

enum class Collective { kAllGather, kReduceScatter, kAllReduce, kAllToAll };
const char* CollectiveName(Collective c);  // "all-gather", ...

struct CommCost {
  double seconds = 0;
  std::array<double, kNumLevels> seconds_per_level = {0, 0, 0};
  std::array<double, kNumLevels> bytes_per_level = {0, 0, 0};  // Sent per rank.
};

// `bytes`: the full gathered buffer for all-gather / reduce-scatter /
// all-reduce, the per-rank send buffer for all-to-all. A group of one
// costs nothing.
CommCost CollectiveCost(const Topology& topology, const GroupShape& group, Collective collective,
                        double bytes);

// Seconds for `flops` at `efficiency` (0..1] of `peak_flops`.
double ComputeSeconds(double flops, double peak_flops, double efficiency);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_COST_MODEL_H_
