#ifndef RECFLEET_WORKER_RANK_DATA_H_
#define RECFLEET_WORKER_RANK_DATA_H_

// Where one rank's training samples come from, step by step: a data-loader
// service (loader_rank_data.h) or the dataset file itself. Either way
// global step s (1-based) of a job holds the same samples on every attempt,
// so a run resumed from a checkpoint at step k continues with exactly the
// samples an uninterrupted run would have trained at step k + 1.
//
// Not thread-safe: one training thread asks for its steps in increasing
// order (a resumed run may start at any step).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"

namespace recfleet::worker {

class RankData {
 public:
  virtual ~RankData() = default;
  virtual const data::Schema& schema() const = 0;
  // The samples of global step `step`: rows `*rows` of the returned batch,
  // which stays valid until the next call.
  virtual absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) = 0;
};

// Reads the whole training file into memory and deals it with a BatchPlan
// (batch_plan.h): for datasets that fit in a worker, without a loader.
absl::StatusOr<std::unique_ptr<RankData>> OpenDatasetRankData(const std::string& path, int rank, int world_size,
                                                              int64_t local_batch, uint64_t seed);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_RANK_DATA_H_
