#ifndef RECFLEET_WORKER_RANK_SYNC_H_
#define RECFLEET_WORKER_RANK_SYNC_H_

// What it costs ranks of one host to step together, measured with the
// worker's own distributed code: the engine's CPU probe models
// (engine::RateProbeModels(kCpu)) trained by `ranks` Gloo ranks on threads
// of this process over 127.0.0.1 (each with its own transport, as separate
// worker processes would be), every dense parameter sharded over all of
// them (FSDP) and the tables replicated (each rank looks up locally; touched
// rows all-reduced), against the same probe stepped by one rank alone
// (engine::MeasureStep: the rank's thread CPU time, what the rate table
// fits). The ratio holds everything a single rank cannot see: waits for the
// slowest rank at each synchronous collective, the collectives over
// loopback, wake-ups, cores that share memory bandwidth and caches.
//
// The rate table's rank_sync_overhead is the median of the probes' ratios
// minus 1; the planner adds that fraction of the compute to plans of more
// than one rank (planner::PlanRequest::rank_sync_fraction).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/calibrate.h"

namespace recfleet::worker {

struct RankSyncProbe {
  std::string name;             // "probe3 d=64 B=32 L<=48".
  double single_seconds = 0;    // One rank alone (thread CPU time).
  double ranks_seconds = 0;     // Wall time per step of the slowest rank.
};

struct RankSyncResult {
  int ranks = 0;
  std::vector<RankSyncProbe> probes;
  double overhead = 0;  // Median of ranks_seconds / single_seconds, minus 1; >= 0.
};

// `ranks` >= 2. `options.device` must be kCpu; `options.repeats` (at least
// 6 are used) timed steps after `options.warmup`; `max_probes` > 0 times
// only the first that many probes. Errors of any rank (rendezvous, a
// collective) are returned. A measurement: run it on a machine whose cores
// are the job's (other processes' load shows up as overhead).
absl::StatusOr<RankSyncResult> MeasureRankSync(int ranks, const engine::RateProbeOptions& options,
                                               int max_probes = 0);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_RANK_SYNC_H_
