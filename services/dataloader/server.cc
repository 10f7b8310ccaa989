#include "services/dataloader/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace recfleet::dataloader {

absl::StatusOr<std::unique_ptr<LoaderServer>> LoaderServer::Start(const ServerOptions& options) {
  std::unique_ptr<LoaderServer> s(new LoaderServer());
  s->host_ = options.host;
  s->metrics_data_ = std::make_unique<LoaderMetrics>();
  s->service_ = std::make_unique<DataLoaderService>(options.datasets, options.service,
                                                    s->metrics_data_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxSendMessageSize(-1);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("data loader: cannot listen on ", options.host, ":", options.port));
  }
  if (options.metrics_port >= 0) {
    auto http = StartMetricsServer(absl::StrCat(options.host, ":", options.metrics_port),
                                   &s->metrics_data_->registry());
    if (!http.ok()) return http.status();
    s->metrics_ = *std::move(http);
  }
  return s;
}

LoaderServer::~LoaderServer() { Shutdown(); }

std::string LoaderServer::address() const { return absl::StrCat(host_, ":", port_); }

void LoaderServer::Wait() { server_->Wait(); }

void LoaderServer::Shutdown() {
  if (server_ != nullptr && !shut_down_.exchange(true)) {
    // Open streams get a short grace period, then are cancelled.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  metrics_.reset();
}

}  // namespace recfleet::dataloader
