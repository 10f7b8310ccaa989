#ifndef RECFLEET_SERVICES_COORDINATOR_SERVER_H_
#define RECFLEET_SERVICES_COORDINATOR_SERVER_H_

// A running coordinator: the Coordinator over its SQLite store, served on
// gRPC (JobService, WorkerService, grpc.health.v1.Health, server reflection)
// and, optionally, Prometheus /metrics over HTTP. Used by the coordinator
// binary, by cross-process and CLI tests (on 127.0.0.1:0) and benchmarks.
//
// Thread-safe accessors; Shutdown from the owner.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "services/common/bearer_auth.h"
#include "services/common/http_server.h"
#include "services/common/metrics.h"
#include "services/common/rpc_guard.h"
#include "services/common/rpc_metrics.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/job_service.h"
#include "services/coordinator/worker_service.h"

namespace recfleet::coordinator {

struct ServerOptions {
  // gRPC "host:port"; port 0 = the OS picks (see address()).
  std::string listen_address = "127.0.0.1:0";
  // SQLite file of the job store; ":memory:" keeps nothing across restarts.
  std::string db_path = ":memory:";
  // "host:port" for /metrics and /healthz; empty = no HTTP endpoint.
  std::string metrics_address;
  // Bearer tokens (health and reflection excepted): every JobService call
  // must carry `auth_token` (the users'), every WorkerService call
  // `worker_token` (the workers'). Both empty = no authentication; one
  // without the other, or the two equal, is refused at Start, so a user's
  // token can never register a worker nor a worker's call a job.
  std::string auth_token;
  std::string worker_token;
  // Transport security of the gRPC port (services/common/tls.h); null =
  // plain text.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  CoordinatorOptions coordinator;
  // Period of the control loop (lease sweep, scheduling, progress flush);
  // zero = min(lease / 4, 1 s).
  absl::Duration tick_interval = absl::ZeroDuration();
};

class CoordinatorServer {
 public:
  // Errors: those of JobStore::Open, INVALID_ARGUMENT / UNAVAILABLE naming an
  // address that cannot be bound, INVALID_ARGUMENT for tokens as above.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(ServerOptions options);
  ~CoordinatorServer();  // Shuts down.

  // The bound gRPC address, "host:port".
  const std::string& address() const { return address_; }
  // The bound /metrics address, or "" without one.
  std::string metrics_address() const { return http_ ? http_->address() : ""; }
  Coordinator* coordinator() { return coordinator_.get(); }
  metrics::MetricRegistry* metrics() { return &registry_; }

  // Stops accepting calls, ends streams and waits, then stops the
  // coordinator. Idempotent.
  void Shutdown();
  // Blocks until Shutdown() has been called (from another thread).
  void Wait();

 private:
  CoordinatorServer(const ServerOptions& options);

  metrics::MetricRegistry registry_;
  BearerAuth user_auth_;
  BearerAuth worker_auth_;
  std::unique_ptr<RpcMetrics> job_rpc_metrics_;
  std::unique_ptr<RpcMetrics> worker_rpc_metrics_;
  std::unique_ptr<RpcGuard> job_guard_;
  std::unique_ptr<RpcGuard> worker_guard_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::string address_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_SERVER_H_
