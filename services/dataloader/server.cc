#include "services/dataloader/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/common/address.h"
#include "services/common/data_grant.h"

namespace recfleet::dataloader {
namespace {

// Checks the bearer token and the job's data grant, then hands the call to
// the loader's service. Every DataLoader method must be forwarded here
// (server_auth_test calls each method of the service descriptor and fails
// on one left UNIMPLEMENTED).
class AuthenticatedService final : public recfleet::v1::DataLoader::Service {
 public:
  AuthenticatedService(recfleet::v1::DataLoader::Service* inner, const BearerAuth* auth,
                       std::string data_grant_key)
      : inner_(inner), auth_(auth), data_grant_key_(std::move(data_grant_key)) {}

  grpc::Status GetInfo(grpc::ServerContext* ctx, const recfleet::v1::GetInfoRequest* req,
                       recfleet::v1::LoaderInfo* out) override {
    if (absl::Status s = Authorize(*ctx, req->config(), req->data_grant()); !s.ok()) return ToGrpc(s);
    return inner_->GetInfo(ctx, req, out);
  }
  grpc::Status StreamBatches(grpc::ServerContext* ctx,
                             const recfleet::v1::StreamBatchesRequest* req,
                             grpc::ServerWriter<recfleet::v1::RankBatch>* writer) override {
    if (absl::Status s = Authorize(*ctx, req->config(), req->data_grant()); !s.ok()) return ToGrpc(s);
    return inner_->StreamBatches(ctx, req, writer);
  }

 private:
  absl::Status Authorize(const grpc::ServerContext& ctx, const recfleet::v1::DataConfig& config,
                         const std::string& grant) const {
    if (absl::Status s = auth_->Check(ctx); !s.ok()) return s;
    if (data_grant_key_.empty()) return absl::OkStatus();
    return CheckDataGrant(data_grant_key_, config, grant);
  }

  recfleet::v1::DataLoader::Service* const inner_;
  const BearerAuth* const auth_;
  const std::string data_grant_key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LoaderServer>> LoaderServer::Start(const ServerOptions& options) {
  std::unique_ptr<LoaderServer> s(new LoaderServer());
  s->host_ = options.host;
  s->metrics_data_ = std::make_unique<LoaderMetrics>();
  s->service_ = std::make_unique<DataLoaderService>(options.datasets, options.service,
                                                    s->metrics_data_.get());
  s->auth_ = std::make_unique<BearerAuth>(options.auth_token);
  s->authenticated_ = std::make_unique<AuthenticatedService>(s->service_.get(), s->auth_.get(),
                                                             options.data_grant_key);
  // Standard health checks (grpc.health.v1, for load balancers and
  // Kubernetes gRPC probes) and reflection (grpcurl), as on the coordinator;
  // neither needs the token nor reveals any data.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      FormatHostPort(options.host, options.port),
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &s->port_);
  builder.RegisterService(s->authenticated_.get());
  builder.SetMaxSendMessageSize(-1);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("data loader: cannot listen on ", options.host, ":", options.port));
  }
  s->server_->GetHealthCheckService()->SetServingStatus("recfleet.v1.DataLoader", true);
  if (options.metrics_port >= 0) {
    auto http = StartMetricsServer(absl::StrCat(options.host, ":", options.metrics_port),
                                   &s->metrics_data_->registry());
    if (!http.ok()) return http.status();
    s->metrics_ = *std::move(http);
  }
  return s;
}

LoaderServer::~LoaderServer() { Shutdown(); }

std::string LoaderServer::address() const { return FormatHostPort(host_, port_); }

void LoaderServer::Wait() { server_->Wait(); }

void LoaderServer::Shutdown() {
  if (server_ != nullptr && !shut_down_.exchange(true)) {
    server_->GetHealthCheckService()->Shutdown();
    // Open streams get a short grace period, then are cancelled.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  metrics_.reset();
}

}  // namespace recfleet::dataloader
