#ifndef RECFLEET_SERVICES_DATALOADER_SERVICE_H_
#define RECFLEET_SERVICES_DATALOADER_SERVICE_H_

// The DataLoader gRPC service: a thin adapter that streams the epoch
// loader's rank batches (data/loader.h) to workers.
//
// Each StreamBatches call runs a producer thread that prepares the rank's
// batches up to `prefetch` steps ahead into a bounded queue; the handler
// writes them in order (gRPC's blocking Write applies the client's flow
// control). A step is dealt once (Loader::Plan, serialized) and shared by
// the ranks' streams through a small cache; each stream gathers and encodes
// its own rank's samples on its own thread, so ranks proceed in parallel.
// A plan leaves the cache once every rank has taken it; an evicted one is
// recomputed identically, since the loader is deterministic. Thread-safe.

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "data/loader.h"
#include "recfleet/v1/dataloader.grpc.pb.h"
#include "services/dataloader/metrics.h"

namespace recfleet::dataloader {

struct ServiceOptions {
  int prefetch = 4;  // Batches computed ahead per stream.
};

class DataLoaderService final : public recfleet::v1::DataLoader::Service {
 public:
  DataLoaderService(std::unique_ptr<data::Loader> loader, ServiceOptions options,
                    LoaderMetrics* metrics);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const recfleet::v1::GetInfoRequest* req,
                       recfleet::v1::LoaderInfo* out) override;
  grpc::Status StreamBatches(grpc::ServerContext* ctx,
                             const recfleet::v1::StreamBatchesRequest* req,
                             grpc::ServerWriter<recfleet::v1::RankBatch>* writer) override;

 private:
  // The plan of (epoch, step), computed or cached; counts `rank` as having
  // taken it.
  absl::StatusOr<std::shared_ptr<const data::StepPlan>> TakePlan(int64_t epoch, int64_t step,
                                                                 int rank);

  const ServiceOptions options_;
  LoaderMetrics* const metrics_;
  const int first_rank_;
  const int num_ranks_;
  const int64_t steps_per_epoch_;
  recfleet::v1::LoaderInfo info_;

  absl::Mutex mu_;
  std::unique_ptr<data::Loader> loader_ ABSL_GUARDED_BY(mu_);
  struct CachedPlan {
    std::pair<int64_t, int64_t> key;  // (epoch, step)
    std::shared_ptr<const data::StepPlan> plan;
    std::vector<bool> taken;  // Per local rank.
    int taken_count = 0;
  };
  // Recently computed plans, most recent first.
  std::list<CachedPlan> cache_ ABSL_GUARDED_BY(mu_);
  size_t cache_capacity_;
  std::pair<int64_t, int64_t> last_recorded_ ABSL_GUARDED_BY(mu_) = {-1, -1};
};

// Converts a data-library status into a gRPC status with the same code.
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_SERVICE_H_
