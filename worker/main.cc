// recfleet-worker: the worker daemon. Registers with the coordinator under
// its topology labels, keeps its lease alive, trains the ranks it is
// assigned, and serves /metrics. Stops cleanly on SIGINT / SIGTERM.
//
//   recfleet-worker --coordinator 127.0.0.1:7070 --node n0 --work_dir /tmp/w0
//   recfleet-worker --device cuda [--gpus 0,1] --coordinator ... --work_dir /tmp/w
//
// With --device cuda every chosen GPU gets its own worker (one rank per
// GPU): with one GPU this process is that worker; with several it starts one
// child process per GPU (worker/gpu_selection.h) and waits for them,
// passing SIGINT / SIGTERM on.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "services/common/client_tls_flags.h"
#include "services/common/flags.h"
#include "services/common/http_server.h"
#include "engine/cuda_device.h"
#include "services/common/log.h"
#include "spdlog/spdlog.h"
#include "worker/agent.h"
#include "worker/gpu_selection.h"
#include "worker/training_task.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "host:port of the coordinator's gRPC endpoint.");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address of this worker as the coordinator and the other ranks reach it (also the Gloo transport's).");
ABSL_FLAG(std::string, node, "", "Topology: node (host) id; default = --host.");
ABSL_FLAG(std::string, nvlink_domain, "", "Topology: NVLink domain id.");
ABSL_FLAG(std::string, zone, "", "Topology: failure / network zone.");
ABSL_FLAG(std::string, device, "cpu",
          "Device the ranks train on: cpu (the CPU reference engine) or cuda (one worker per GPU; jobs with "
          "spec.resources.gpus_per_worker = 1 train on it, jobs asking for no GPU on the CPU).");
ABSL_FLAG(std::string, gpus, "all", "--device cuda: the GPUs to run workers on, e.g. 0,2 (default: all of them).");
ABSL_FLAG(std::string, precision, "bf16",
          "--device cuda: bf16 (bf16 GEMMs and attention, fp32 master weights) or fp32.");
ABSL_FLAG(double, peak_flops, 0,
          "--device cuda: peak FLOP/s that MFU divides by; 0 = by GPU name (989e12, dense bf16, for H100 / H200; "
          "other GPUs export no MFU unless this is set).");
ABSL_FLAG(std::string, work_dir, "", "This worker's scratch directory (required).");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Where jobs that name no spec.training.checkpoint_dir checkpoint (<root>/<job id>); must be storage every "
          "worker of a job shares. Default: <work_dir>/checkpoints, which only single-worker jobs can share.");
ABSL_FLAG(std::string, sample_log_dir, "",
          "If set, append every trained step's sample ids to per-rank logs here (audit of exactly-once training).");
ABSL_FLAG(std::string, data_root, "",
          "Relative dataset paths of jobs this worker reads itself (no data-loader) are taken from here, and when set, "
          "a job may name no dataset outside it; default: the working directory, any path.");
ABSL_FLAG(std::string, synthetic_cache_dir, "",
          "Where synthetic:// datasets are generated; default: $TMPDIR/recfleet-synthetic.");
ABSL_FLAG(double, comm_timeout, 60, "Seconds any collective (and the rendezvous) may take before failing.");

namespace {

// Set by SIGINT / SIGTERM; polled by a thread that stops the agent (the
// handler itself may only touch a sig_atomic_t).
volatile std::sig_atomic_t g_signalled = 0;

void OnSignal(int) { g_signalled = 1; }

// Runs one child worker per GPU (this program, one --gpus each) and waits
// for all of them, passing SIGINT / SIGTERM on. Returns the first nonzero
// exit status, else 0.
int RunPerGpu(const std::vector<std::string>& argv, const std::vector<int>& gpus, const std::string& work_dir) {
  std::vector<pid_t> children;
  for (int g : gpus) {
    const std::string dir = work_dir + "/gpu-" + std::to_string(g);
    ::mkdir(dir.c_str(), 0755);
    std::vector<std::string> args = recfleet::worker::ChildCommandLine(argv, g, work_dir);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("recfleet-worker: fork");
      for (pid_t c : children) ::kill(c, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      ::execv("/proc/self/exe", cargs.data());
      std::perror("recfleet-worker: exec");
      ::_exit(127);
    }
    std::printf("worker for GPU %d: pid %d, work dir %s\n", g, static_cast<int>(pid), dir.c_str());
    std::fflush(stdout);
    children.push_back(pid);
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  int result = 0;
  size_t running = children.size();
  bool forwarded = false;
  while (running > 0) {
    if (g_signalled && !forwarded) {
      for (pid_t c : children) ::kill(c, SIGTERM);
      forwarded = true;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      ::usleep(50 * 1000);
      continue;
    }
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0) {
      spdlog::error("the worker of pid {} exited with {}", static_cast<int>(done), code);
      if (result == 0) result = code;
    }
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("recfleet-worker --coordinator HOST:PORT --work_dir DIR [--node N ...]");
  // Shared server flags (services/common/flags.h); a worker serves /metrics
  // unless told otherwise, on a port the OS picks.
  absl::SetFlag(&FLAGS_metrics_address, "127.0.0.1:0");
  absl::ParseCommandLine(argc, argv);
  recfleet::InitLogging("recfleet-worker");
  const std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  if (work_dir.empty()) {
    spdlog::error("--work_dir is required");
    return 2;
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    spdlog::error("--device must be cpu or cuda, got '{}'", device);
    return 2;
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision != "bf16" && precision != "fp32") {
    spdlog::error("--precision must be bf16 or fp32, got '{}'", precision);
    return 2;
  }
  std::optional<recfleet::engine::CudaDeviceInfo> gpu;
  if (device == "cuda") {
    absl::StatusOr<std::vector<recfleet::engine::CudaDeviceInfo>> devices = recfleet::engine::ListCudaDevices();
    if (!devices.ok()) {
      spdlog::error("--device cuda: {}", std::string(devices.status().message()));
      return 2;
    }
    absl::StatusOr<std::vector<int>> chosen =
        recfleet::worker::SelectGpus(absl::GetFlag(FLAGS_gpus), static_cast<int>(devices->size()));
    if (!chosen.ok()) {
      spdlog::error("{}", std::string(chosen.status().message()));
      return 2;
    }
    if (chosen->size() > 1) return RunPerGpu(std::vector<std::string>(argv, argv + argc), *chosen, work_dir);
    gpu = (*devices)[chosen->front()];
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    spdlog::error(
        "--auth_token_file is the users' token; a worker registers with the workers' token: pass "
        "--worker_token_file (or set $RECFLEET_WORKER_TOKEN)");
    return 2;
  }
  absl::StatusOr<std::string> token_or = recfleet::LoadWorkerToken();
  if (!token_or.ok()) {
    spdlog::error("{}", std::string(token_or.status().message()));
    return 2;
  }
  const std::string token = *token_or;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials_or =
      recfleet::MakeChannelCredentials(recfleet::ClientTlsOptionsFromFlags());
  if (!credentials_or.ok()) {
    spdlog::error("{}", std::string(credentials_or.status().message()));
    return 2;
  }
  // One set of credentials for the coordinator and every data loader: one
  // cluster CA signs them all.
  const std::shared_ptr<grpc::ChannelCredentials> credentials = *credentials_or;
  if (absl::GetFlag(FLAGS_tls_ca).empty()) {
    spdlog::warn("plain text gRPC to the coordinator and data loaders (no --tls_ca)");
  }

  recfleet::worker::WorkerMetrics metrics;
  std::unique_ptr<recfleet::HttpServer> http;
  if (!absl::GetFlag(FLAGS_metrics_address).empty()) {
    absl::StatusOr<std::unique_ptr<recfleet::HttpServer>> started =
        recfleet::StartMetricsServer(absl::GetFlag(FLAGS_metrics_address), &metrics.registry());
    if (!started.ok()) {
      spdlog::error("--metrics_address: {}", started.status().ToString());
      return 2;
    }
    http = std::move(*started);
    std::printf("worker metrics: http://%s/metrics\n", http->address().c_str());
    std::fflush(stdout);
  }

  // The bearer token (if any) goes into each call's metadata, so it works
  // the same over TLS and over plain text on loopback.
  std::shared_ptr<recfleet::v1::WorkerService::StubInterface> stub =
      recfleet::v1::WorkerService::NewStub(grpc::CreateChannel(absl::GetFlag(FLAGS_coordinator), credentials));

  recfleet::worker::TrainingOptions training;
  training.checkpoint_root =
      absl::GetFlag(FLAGS_checkpoint_root).empty() ? work_dir + "/checkpoints" : absl::GetFlag(FLAGS_checkpoint_root);
  training.gloo_host = absl::GetFlag(FLAGS_host);
  training.datasets.root = absl::GetFlag(FLAGS_data_root);
  training.datasets.cache_dir = absl::GetFlag(FLAGS_synthetic_cache_dir);
  training.sample_log_dir = absl::GetFlag(FLAGS_sample_log_dir);
  training.comm_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout));
  training.auth_token = token;
  training.loader_credentials = credentials;
  if (gpu.has_value()) {
    training.device = recfleet::Device::kCuda;
    training.gpu_index = gpu->index;
    training.bf16 = precision == "bf16";
    training.cuda_peak_flops = absl::GetFlag(FLAGS_peak_flops) > 0 ? absl::GetFlag(FLAGS_peak_flops)
                                                                   : recfleet::worker::PeakBf16FlopsOf(gpu->name);
    std::printf("worker GPU %d: %s, %.1f GiB, %s, MFU peak %.3g FLOP/s\n", gpu->index, gpu->name.c_str(),
                gpu->memory_bytes / 1073741824.0, precision.c_str(), training.cuda_peak_flops);
    if (training.cuda_peak_flops <= 0) {
      spdlog::warn("no known peak for '{}': MFU is not exported (pass --peak_flops)", gpu->name);
    }
    std::fflush(stdout);
  }
  recfleet::worker::TrainingTask task(stub, training, &metrics);

  recfleet::worker::AgentOptions options;
  options.auth_token = token;
  if (gpu.has_value()) {
    options.registration = recfleet::worker::GpuWorkerRegistration(
        {absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_node), absl::GetFlag(FLAGS_nvlink_domain),
         absl::GetFlag(FLAGS_zone)},
        gpu->index, gpu->name, gpu->memory_bytes);
  } else {
    options.registration.set_host(absl::GetFlag(FLAGS_host));
    recfleet::v1::Topology* topology = options.registration.mutable_topology();
    topology->set_node(absl::GetFlag(FLAGS_node).empty() ? absl::GetFlag(FLAGS_host) : absl::GetFlag(FLAGS_node));
    topology->set_nvlink_domain(absl::GetFlag(FLAGS_nvlink_domain));
    topology->set_zone(absl::GetFlag(FLAGS_zone));
  }
  if (http != nullptr) options.registration.set_metrics_address(http->address());
  recfleet::worker::Agent agent(stub, options, &task);
  agent.set_on_registered([](const std::string& id) {
    std::printf("worker id: %s\n", id.c_str());
    std::fflush(stdout);
  });

  absl::Notification done;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::thread stopper([&] {
    while (!g_signalled && !done.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    }
    agent.Stop();
  });
  absl::Status s = agent.Run();
  done.Notify();
  stopper.join();
  if (http != nullptr) http->Stop();
  if (!s.ok()) {
    spdlog::error("{}", s.ToString());
    return 1;
  }
  return 0;
}
