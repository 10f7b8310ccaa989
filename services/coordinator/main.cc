// recfleet-coordinator: the control plane. Serves JobService and
// WorkerService on --listen, keeps jobs in the SQLite file --db, exports
// Prometheus metrics on --metrics_address. Stops cleanly on SIGINT/SIGTERM.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/step_rates.h"
#include "planner/yaml_io.h"
#include "services/common/address.h"
#include "services/common/flags.h"
#include "services/common/log.h"
#include "services/common/server_tls_flags.h"
#include "services/coordinator/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC listen address host:port; port 0 = the OS picks (printed at start-up)");
ABSL_FLAG(std::string, db, "recfleet-coordinator.db",
          "SQLite file holding every job and transition; created if missing");
ABSL_FLAG(double, lease_seconds, 10, "Workers whose heartbeats stop for this long are lost");
ABSL_FLAG(std::string, loader_address, "",
          "Data-loader host:port handed to workers in assignments (empty = none)");
ABSL_FLAG(std::vector<std::string>, step_rates, {},
          "Measured rate tables of the engine (`recfleet data calibrate --rates`, e.g. "
          "bench/rates/h200-bf16.yaml), comma-separated, at most one per device: the planner "
          "predicts each job's step time and peak memory from its real model with the table of "
          "the job's device; without: shape estimates");
ABSL_FLAG(std::string, data_root, "",
          "Where relative dataset paths of job specs resolve when the planner samples their "
          "lengths: the loaders' and workers' --data_root (empty = the working directory). When set, "
          "CreateJob and PlanJob refuse a spec whose dataset lies outside it");
ABSL_FLAG(std::string, hardware_topology, "",
          "Planner topology YAML whose GPU and link numbers describe the workers' hardware "
          "(e.g. a calibrated CPU cluster); default: H200 nodes");
ABSL_FLAG(std::string, data_grant_key_file, "",
          "File holding the secret shared with the data loaders (their --data_grant_key_file): "
          "each assignment then carries its job's data grant, and such a loader serves a job's "
          "data only to its ranks; empty = $RECFLEET_DATA_GRANT_KEY, neither = no grants");
ABSL_FLAG(std::string, address_file, "",
          "If set, the bound gRPC address is written to this file once serving (for scripts)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("recfleet coordinator: job API, worker registry, gang scheduler");
  absl::ParseCommandLine(argc, argv);
  recfleet::InitLogging("recfleet-coordinator");

  // Signals are taken by a sigwait below, not by handlers in random threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  recfleet::coordinator::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.db_path = absl::GetFlag(FLAGS_db);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  const double lease = absl::GetFlag(FLAGS_lease_seconds);
  if (!(lease > 0)) {
    spdlog::error("--lease_seconds must be > 0, got {}", lease);
    return 2;
  }
  options.coordinator.lease = absl::Seconds(lease);
  options.coordinator.loader_address = absl::GetFlag(FLAGS_loader_address);
  options.coordinator.data_root = absl::GetFlag(FLAGS_data_root);
  if (const std::string topology = absl::GetFlag(FLAGS_hardware_topology); !topology.empty()) {
    absl::StatusOr<recfleet::planner::Topology> hardware = recfleet::planner::LoadTopologyYaml(topology);
    if (!hardware.ok()) {
      spdlog::error("--hardware_topology: {}", std::string(hardware.status().message()));
      return 2;
    }
    options.coordinator.planner_hardware = *std::move(hardware);
  }
  for (const std::string& path : absl::GetFlag(FLAGS_step_rates)) {
    absl::StatusOr<recfleet::engine::StepRates> rates = recfleet::engine::ReadStepRates(path);
    if (!rates.ok()) {
      spdlog::error("--step_rates: {}", std::string(rates.status().message()));
      return 2;
    }
    options.coordinator.step_rates.push_back(*std::move(rates));
  }
  absl::StatusOr<std::string> token = recfleet::LoadAuthToken();
  if (!token.ok()) {
    spdlog::error("{}", std::string(token.status().message()));
    return 2;
  }
  options.auth_token = *token;
  absl::StatusOr<std::string> worker_token = recfleet::LoadWorkerToken();
  if (!worker_token.ok()) {
    spdlog::error("{}", std::string(worker_token.status().message()));
    return 2;
  }
  options.worker_token = *worker_token;
  absl::StatusOr<std::string> grant_key =
      recfleet::LoadSecret("--data_grant_key_file", absl::GetFlag(FLAGS_data_grant_key_file),
                           std::getenv("RECFLEET_DATA_GRANT_KEY"));
  if (!grant_key.ok()) {
    spdlog::error("{}", std::string(grant_key.status().message()));
    return 2;
  }
  options.coordinator.data_grant_key = *grant_key;
  absl::StatusOr<recfleet::HostPort> listen = recfleet::ParseHostPort(options.listen_address, "--listen");
  if (!listen.ok()) {
    spdlog::error("{}", std::string(listen.status().message()));
    return 2;
  }
  absl::StatusOr<recfleet::ServerTransport> transport =
      recfleet::MakeServerTransport(recfleet::ServerTlsOptionsFromFlags(), listen->host);
  if (!transport.ok()) {
    spdlog::error("{}", std::string(transport.status().message()));
    return 2;
  }
  if (!transport->tls) spdlog::warn("{}", transport->description);
  options.credentials = transport->credentials;

  absl::StatusOr<std::unique_ptr<recfleet::coordinator::CoordinatorServer>> server =
      recfleet::coordinator::CoordinatorServer::Start(options);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  std::printf("recfleet coordinator serving on %s (db %s, lease %gs, auth %s, %s)\n",
              (*server)->address().c_str(), options.db_path.c_str(), lease,
              options.auth_token.empty() ? "off" : "user and worker tokens",
              transport->tls ? transport->description.c_str() : "plain text");
  if (!(*server)->metrics_address().empty()) {
    std::printf("metrics on http://%s/metrics\n", (*server)->metrics_address().c_str());
  }
  std::fflush(stdout);
  const std::string address_file = absl::GetFlag(FLAGS_address_file);
  if (!address_file.empty()) {
    // Written to a temporary name and renamed, so readers never see half.
    std::string tmp = address_file + ".tmp";
    std::ofstream(tmp) << (*server)->address() << "\n";
    if (std::rename(tmp.c_str(), address_file.c_str()) != 0) {
      spdlog::error("cannot write --address_file {}", address_file);
      return 1;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}, shutting down", sig);
  (*server)->Shutdown();
  return 0;
}
