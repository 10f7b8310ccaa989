#ifndef RECFLEET_WORKER_RANK_DATA_H_
#define RECFLEET_WORKER_RANK_DATA_H_

// Where one rank's training samples come from, step by step: the job's
// DataConfig dealt by a data-loader service, or by the same loader code in
// this process (services/dataloader/job_loader.h). Either way the batches
// are identical, and global step s (1-based) of a job holds the same samples
// on every attempt, so a run resumed from a checkpoint at step k continues
// with exactly the samples an uninterrupted run would have trained at step
// k + 1. Global step s is step (s - 1) % E of epoch (s - 1) / E, E = the
// job's steps per epoch.
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
#include "recfleet/v1/dataloader.pb.h"
#include "services/dataloader/client.h"
#include "services/dataloader/job_loader.h"

namespace recfleet::worker {

class RankData {
 public:
  virtual ~RankData() = default;
  virtual const data::Schema& schema() const = 0;
  virtual int64_t steps_per_epoch() const = 0;
  // The samples of global step `step`: rows `*rows` of the returned batch,
  // which stays valid until the next call.
  virtual absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) = 0;
};

// Streams `rank`'s batches of the job `config` from the loader at `address`.
// Errors are the loader's: NotFound naming a missing dataset,
// FailedPrecondition for a dataset smaller than one step.
absl::StatusOr<std::unique_ptr<RankData>> OpenLoaderRankData(const std::string& address,
                                                             const v1::DataConfig& config, int rank,
                                                             dataloader::ConnectOptions connect = {});

// Deals the job `config` in this process (every rank of the job computes
// the same deal and takes its own part).
absl::StatusOr<std::unique_ptr<RankData>> OpenLocalRankData(const v1::DataConfig& config, int rank,
                                                            const dataloader::DatasetOptions& datasets);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_RANK_DATA_H_
