#ifndef RECFLEET_SERVICES_DATALOADER_SERVICE_H_
#define RECFLEET_SERVICES_DATALOADER_SERVICE_H_

// The DataLoader gRPC service: a thin adapter that streams the rank batches
// of any number of jobs to their workers. Each request carries its job's
// DataConfig; the job is opened on first use (job_loader.h) and shared by
// its ranks' streams.
//
// Each StreamBatches call runs a producer thread that prepares the rank's
// batches up to `prefetch` steps ahead into a bounded queue; the handler
// writes them in order (gRPC's blocking Write applies the client's flow
// control). A step is dealt once per job and shared by the ranks' streams
// (JobLoader::TakePlan); each stream gathers and encodes its own rank's
// samples on its own thread, so ranks and jobs proceed in parallel.
// Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/dataloader/job_loader.h"
#include "recfleet/v1/dataloader.grpc.pb.h"
#include "services/dataloader/metrics.h"

namespace recfleet::dataloader {

struct ServiceOptions {
  int prefetch = 4;  // Batches computed ahead per stream.
};

class DataLoaderService final : public recfleet::v1::DataLoader::Service {
 public:
  DataLoaderService(DatasetOptions datasets, ServiceOptions options, LoaderMetrics* metrics);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const recfleet::v1::GetInfoRequest* req,
                       recfleet::v1::LoaderInfo* out) override;
  grpc::Status StreamBatches(grpc::ServerContext* ctx,
                             const recfleet::v1::StreamBatchesRequest* req,
                             grpc::ServerWriter<recfleet::v1::RankBatch>* writer) override;

 private:
  // The job `config` names, opened on first use.
  absl::StatusOr<std::shared_ptr<JobLoader>> Job(const recfleet::v1::DataConfig& config);

  const ServiceOptions options_;
  LoaderMetrics* const metrics_;
  JobLoaders jobs_;
};

// Converts a data-library status into a gRPC status with the same code.
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_SERVICE_H_
