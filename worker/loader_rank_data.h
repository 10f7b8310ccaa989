#ifndef RECFLEET_WORKER_LOADER_RANK_DATA_H_
#define RECFLEET_WORKER_LOADER_RANK_DATA_H_

// A rank's training data streamed by a data-loader service
// (services/dataloader): global step s (1-based) is step (s - 1) % E of
// epoch (s - 1) / E, E = the loader's steps per epoch. The loader's batches
// are a pure function of (seed, epoch, step), so a resumed rank simply
// opens its stream at the step after its checkpoint.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/dataloader/client.h"
#include "worker/rank_data.h"

namespace recfleet::worker {

// FailedPrecondition when the loader does not serve `rank` or its batches
// are not `local_batch` samples (the job's spec.data.local_batch_size).
absl::StatusOr<std::unique_ptr<RankData>> OpenLoaderRankData(const std::string& address, int rank,
                                                             int64_t local_batch,
                                                             const dataloader::ConnectOptions& connect);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_LOADER_RANK_DATA_H_
