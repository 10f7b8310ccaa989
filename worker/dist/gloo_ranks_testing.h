#ifndef RECFLEET_WORKER_DIST_GLOO_RANKS_TESTING_H_
#define RECFLEET_WORKER_DIST_GLOO_RANKS_TESTING_H_

// A job's ranks for tests: `world_size` Gloo ranks on threads over
// 127.0.0.1, each connected the way the worker connects its rank
// (worker/rank_run.cc): a world communicator, then the training groups
// TrainingGroupSpecs derives from a plan's groups (or the hints).

#include <functional>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/dist/layout.h"

namespace recfleet {
namespace dist {

// Runs `fn(rank, groups, world)` on every rank and returns when all are
// done. Setup failures are gtest failures of the rank's thread (fn is then
// not called on it). Collectives time out after 60 s.
void RunOnGlooRanks(int world_size, const std::vector<NamedGroup>& plan_groups, const ParallelismHints& hints,
                    const std::function<void(int rank, const TrainingGroups& groups, comm::Communicator& world)>& fn);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_GLOO_RANKS_TESTING_H_
