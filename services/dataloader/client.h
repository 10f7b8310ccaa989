#ifndef RECFLEET_SERVICES_DATALOADER_CLIENT_H_
#define RECFLEET_SERVICES_DATALOADER_CLIENT_H_

// DataLoaderClient: what a worker uses to pull its batches.
//
//   auto client = DataLoaderClient::Connect("127.0.0.1:7000", job_data_config);
//   auto stream = (*client)->StreamBatches(rank, epoch, /*start_step=*/0);
//   data::RankBatch batch;
//   while (true) {
//     auto more = (*stream)->Next(&batch);
//     if (!more.ok()) { /* error: server gone, DATA_LOSS, ... */ }
//     if (!*more) break;  // Epoch done.
//     Train(batch.samples, batch.base_batch_offsets);
//   }
//
// After a restart, resume with start_step = the first step not yet trained
// on; the batches are identical to those the failed run would have seen.
// A client is thread-safe; each BatchStream is used by one thread.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/loader.h"
#include "grpcpp/grpcpp.h"
#include "recfleet/v1/dataloader.grpc.pb.h"

namespace recfleet::dataloader {

class BatchStream {
 public:
  ~BatchStream();  // Cancels the stream if it is still open.
  // The next batch in step order: true, or false after the last step.
  absl::StatusOr<bool> Next(data::RankBatch* out);

 private:
  friend class DataLoaderClient;
  BatchStream(std::shared_ptr<const data::Schema> schema) : schema_(std::move(schema)) {}
  std::shared_ptr<const data::Schema> schema_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<recfleet::v1::RankBatch>> reader_;
  recfleet::v1::RankBatch msg_;
  bool done_ = false;
};

// The most bytes of a stream's batches that the transport takes in beyond
// the batch being read (HTTP/2 stream window, BDP probing off), so that a
// worker holds about that plus the loader's prefetched batches ahead of its
// step rather than whatever the loader can send: with gRPC's default
// bandwidth-delay probing the window grew on loopback until a CPU rank held
// ~20 MiB of its epoch's batches (bench/RESULTS.md, "Data plane"). A batch
// larger than this still arrives whole (service_test: StreamReadAhead); a
// GPU worker reads the next batch while the device runs the step.
inline constexpr int kStreamLookaheadBytes = 1 << 20;

// How a client reaches a loader.
struct ConnectOptions {
  absl::Duration timeout = absl::Seconds(10);
  // Transport security (services/common/tls.h); null = plain text.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Bearer token sent with every call ("" = none); the loader's
  // --auth_token_file.
  std::string auth_token;
  // The job's data grant (Assignment.data_grant), sent with every request;
  // "" = none (a loader without a data-grant key needs none).
  std::string data_grant;
};

class DataLoaderClient {
 public:
  // Connects to `target` ("host:port"), waiting up to `options.timeout`,
  // and opens the job `config` describes there; fetches its info (schema,
  // ranks, steps). Errors: the loader's (NOT_FOUND for a missing dataset,
  // naming the path; FAILED_PRECONDITION for a job open with another
  // config; UNAUTHENTICATED without the loader's token; PERMISSION_DENIED
  // without the grant of `config`).
  static absl::StatusOr<std::unique_ptr<DataLoaderClient>> Connect(const std::string& target,
                                                                   const recfleet::v1::DataConfig& config,
                                                                   ConnectOptions options);
  static absl::StatusOr<std::unique_ptr<DataLoaderClient>> Connect(
      const std::string& target, const recfleet::v1::DataConfig& config,
      absl::Duration timeout = absl::Seconds(10)) {
    ConnectOptions options;
    options.timeout = timeout;
    return Connect(target, config, std::move(options));
  }

  const recfleet::v1::LoaderInfo& info() const { return info_; }
  const std::shared_ptr<const data::Schema>& schema() const { return schema_; }

  // Opens a stream of `rank`'s batches for steps [start_step, end_step) of
  // `epoch` (end_step 0: to the end of the epoch).
  absl::StatusOr<std::unique_ptr<BatchStream>> StreamBatches(int rank, int64_t epoch,
                                                             int64_t start_step,
                                                             int64_t end_step = 0);

 private:
  DataLoaderClient() = default;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<recfleet::v1::DataLoader::Stub> stub_;
  std::string auth_token_;
  std::string data_grant_;
  recfleet::v1::DataConfig config_;
  recfleet::v1::LoaderInfo info_;
  std::shared_ptr<const data::Schema> schema_;
};

// gRPC status to absl::Status with the same code and message.
absl::Status FromGrpc(const grpc::Status& s);

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_CLIENT_H_
