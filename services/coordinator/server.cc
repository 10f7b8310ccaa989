#include "services/coordinator/server.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "services/common/address.h"
#include "services/common/process_metrics.h"

namespace recfleet::coordinator {

namespace {

absl::Status CheckTokens(const ServerOptions& options) {
  if (options.auth_token.empty() != options.worker_token.empty()) {
    return absl::InvalidArgumentError(
        "give the coordinator both tokens or neither: --auth_token_file (users) and "
        "--worker_token_file (workers); with only one, the other API would be open to anyone");
  }
  if (!options.auth_token.empty() && options.auth_token == options.worker_token) {
    return absl::InvalidArgumentError(
        "--auth_token_file and --worker_token_file hold the same token; users and workers must "
        "hold different credentials (make a second token)");
  }
  return absl::OkStatus();
}

}  // namespace

CoordinatorServer::CoordinatorServer(const ServerOptions& options)
    : user_auth_(options.auth_token), worker_auth_(options.worker_token) {
  AddProcessMetrics(&registry_);
  auto& rpc_family = AddRpcDurationHistogram(&registry_);
  job_rpc_metrics_ = std::make_unique<RpcMetrics>(&rpc_family, "recfleet.v1.JobService");
  worker_rpc_metrics_ = std::make_unique<RpcMetrics>(&rpc_family, "recfleet.v1.WorkerService");
  job_guard_ = std::make_unique<RpcGuard>(&user_auth_, job_rpc_metrics_.get());
  worker_guard_ = std::make_unique<RpcGuard>(&worker_auth_, worker_rpc_metrics_.get());
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    ServerOptions options) {
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen_address, "--listen");
  if (!listen.ok()) return listen.status();
  if (absl::Status tokens = CheckTokens(options); !tokens.ok()) return tokens;
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options.db_path);
  if (!store.ok()) return store.status();

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(options));
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(*std::move(store), options.coordinator, &s->registry_);
  if (!coordinator.ok()) return coordinator.status();
  s->coordinator_ = *std::move(coordinator);
  s->job_service_ = std::make_unique<JobServiceImpl>(s->coordinator_.get(), s->job_guard_.get());
  s->worker_service_ =
      std::make_unique<WorkerServiceImpl>(s->coordinator_.get(), s->worker_guard_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      options.listen_address,
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &port);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", options.listen_address,
                     " (address in use, or not an address of this machine)"));
  }
  s->address_ = FormatHostPort(listen->host, port);
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus("recfleet.v1.JobService", true);
  health->SetServingStatus("recfleet.v1.WorkerService", true);

  if (!options.metrics_address.empty()) {
    // The read-only status page rides on the metrics address: keep that
    // address reachable by operators only (it lists jobs, labels and plans).
    Coordinator* coordinator = s->coordinator_.get();
    absl::StatusOr<std::unique_ptr<HttpServer>> http = StartMetricsServer(
        options.metrics_address, &s->registry_,
        {{"/status", [coordinator] { return coordinator->StatusPage(); }}});
    if (!http.ok()) {
      s->Shutdown();
      return http.status();
    }
    s->http_ = *std::move(http);
  }
  absl::Duration tick = options.tick_interval;
  if (tick <= absl::ZeroDuration()) tick = std::min(options.coordinator.lease / 4, absl::Seconds(1));
  s->coordinator_->StartLoop(tick);
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (http_) http_->Stop();
  // Pending KvWaits and watch streams end first, so the gRPC drain is quick.
  if (coordinator_) coordinator_->Shutdown();
  if (server_) {
    server_->GetHealthCheckService()->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

void CoordinatorServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

}  // namespace recfleet::coordinator
