#ifndef RECFLEET_SERVICES_DATALOADER_SERVER_H_
#define RECFLEET_SERVICES_DATALOADER_SERVER_H_

// LoaderServer: a running data-loader instance: its gRPC DataLoader service
// (serving every job that asks, job_loader.h) and its /metrics endpoint. Used by
// `recfleet data serve` and by tests (port 0 binds an OS-chosen port).
// With an auth token, every DataLoader call without it is UNAUTHENTICATED;
// with a data-grant key, every call whose data_grant is not the grant of
// the DataConfig it names is PERMISSION_DENIED (dataloader.proto, "Access").

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "services/common/bearer_auth.h"
#include "services/common/http_server.h"
#include "services/dataloader/metrics.h"
#include "services/dataloader/service.h"

namespace recfleet::dataloader {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int metrics_port = 0;  // -1: no metrics endpoint.
  // Where jobs' relative dataset paths and synthetic datasets live.
  DatasetOptions datasets;
  ServiceOptions service;
  // Transport security of the gRPC port (services/common/tls.h); null =
  // plain text.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Bearer token every call must carry (services/common/bearer_auth.h);
  // empty = no authentication.
  std::string auth_token;
  // The secret shared with the coordinator (services/common/data_grant.h);
  // empty = any caller with the bearer token may read any job's data.
  std::string data_grant_key;
};

class LoaderServer {
 public:
  static absl::StatusOr<std::unique_ptr<LoaderServer>> Start(const ServerOptions& options);
  ~LoaderServer();  // Shuts down.

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : -1; }
  std::string address() const;
  const LoaderMetrics& metrics() const { return *metrics_data_; }
  // What GetInfo answers (schema, ranks, steps), fetched at start.

  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // Cancels open streams and stops serving.
  void Shutdown();

 private:
  LoaderServer() = default;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<LoaderMetrics> metrics_data_;
  std::unique_ptr<DataLoaderService> service_;
  std::unique_ptr<BearerAuth> auth_;
  // service_ behind the bearer-token and data-grant checks; what the gRPC
  // server serves.
  std::unique_ptr<recfleet::v1::DataLoader::Service> authenticated_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> metrics_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_SERVER_H_
