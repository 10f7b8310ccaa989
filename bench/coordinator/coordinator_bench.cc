// Coordinator benchmarks on loopback, against a coordinator process:
//  1. CreateJob + GetJob: throughput and latency percentiles with N client
//     threads (every CreateJob is a committed SQLite transaction).
//  2. Heartbeats: W registered workers, each beating at H Hz, for S seconds;
//     the coordinator's CPU use (its own getrusage, read from
//     process_cpu_seconds_total on /metrics) and client-side latency.
//     Baseline, same process and rate: grpc.health.v1.Health/Check, the
//     cheapest handler the same gRPC server offers.
// --tls runs both phases as a deployment does: TLS on the gRPC port
// (deploy/tls/make-certs.sh certificates), users' and workers' tokens on
// every call; the baseline then goes over the same TLS connections.
//
// bazel run -c opt //bench/coordinator:coordinator_bench -- [flags]

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "recfleet/v1/job_service.grpc.pb.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "services/common/exposition.h"
#include "services/common/http_get.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/test_specs.h"

ABSL_FLAG(std::string, coordinator_binary, "services/coordinator/recfleet-coordinator",
          "Coordinator executable to start (path relative to the runfiles under bazel run)");
ABSL_FLAG(std::string, db, "", "Job store file; empty = a fresh file under /tmp");
ABSL_FLAG(double, create_seconds, 10, "Duration of the CreateJob+GetJob phase");
ABSL_FLAG(int, create_threads, 4, "Concurrent CreateJob+GetJob clients");
ABSL_FLAG(int, workers, 10000, "Simulated workers in the heartbeat phase");
ABSL_FLAG(double, heartbeat_hz, 1, "Heartbeats per worker per second");
ABSL_FLAG(double, heartbeat_seconds, 30, "Measured duration of the heartbeat phase");
ABSL_FLAG(double, warmup_seconds, 3, "Unmeasured lead-in of each rate phase");
ABSL_FLAG(int, sender_threads, 2, "Client threads pacing heartbeats");
ABSL_FLAG(int, channels, 4, "gRPC channels (TCP connections) the heartbeats spread over");
ABSL_FLAG(bool, tls, false,
          "TLS on the coordinator's port and bearer tokens on every call, as deployed");
ABSL_FLAG(std::string, make_certs, "deploy/tls/make-certs.sh",
          "make-certs.sh for --tls (path relative to the runfiles under bazel run)");

namespace recfleet {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr char kUserToken[] = "bench-user-token";
constexpr char kWorkerToken[] = "bench-worker-token";

struct Coordinator {
  pid_t pid = -1;
  std::string address, metrics;
  std::string tls_dir;  // With --tls: ca.pem, server.pem, server.key.
};

// Channel credentials for `c`: TLS trusting its CA with --tls.
std::shared_ptr<grpc::ChannelCredentials> Credentials(const Coordinator& c) {
  if (c.tls_dir.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(c.tls_dir + "/ca.pem");
  return grpc::SslCredentials(ssl);
}

// The users' or the workers' token on a call, with --tls.
void Authorize(const Coordinator& c, const char* token, grpc::ClientContext* ctx) {
  if (!c.tls_dir.empty()) ctx->AddMetadata("authorization", std::string("Bearer ") + token);
}

Coordinator StartCoordinator(const std::string& dir) {
  Coordinator c;
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
                                   "--address_file=" + dir + "/address",
                                   // Leases longer than the run: this measures steady-state renewals.
                                   "--lease_seconds=10"};
  args.push_back("--db=" + (absl::GetFlag(FLAGS_db).empty() ? dir + "/bench.db" : absl::GetFlag(FLAGS_db)));
  if (absl::GetFlag(FLAGS_tls)) {
    c.tls_dir = dir + "/tls";
    const std::string make = absl::StrCat(absl::GetFlag(FLAGS_make_certs), " ", c.tls_dir, " >/dev/null");
    if (std::system(make.c_str()) != 0) {
      std::fprintf(stderr, "`%s` failed\n", make.c_str());
      std::exit(1);
    }
    std::ofstream(dir + "/user-token") << kUserToken << "\n";
    std::ofstream(dir + "/worker-token") << kWorkerToken << "\n";
    for (const std::string& a : {"--tls_cert=" + c.tls_dir + "/server.pem", "--tls_key=" + c.tls_dir + "/server.key",
                                 "--auth_token_file=" + dir + "/user-token",
                                 "--worker_token_file=" + dir + "/worker-token"}) {
      args.push_back(a);
    }
  }
  std::fflush(stdout);  // The child must not inherit (and re-print) buffered output.
  std::string log = dir + "/coordinator.log";
  c.pid = fork();
  if (c.pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    std::string binary = absl::GetFlag(FLAGS_coordinator_binary);
    std::vector<char*> argv = {binary.data()};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    std::perror("exec coordinator");
    _exit(127);
  }
  for (int i = 0; i < 400 && c.address.empty(); ++i) {
    std::string a = ReadFile(dir + "/address");
    if (!a.empty()) c.address = a.substr(0, a.find('\n'));
    absl::SleepFor(absl::Milliseconds(25));
  }
  std::string text = ReadFile(log);
  size_t at = text.find("http://");
  if (at != std::string::npos) c.metrics = text.substr(at + 7, text.find("/metrics") - at - 7);
  return c;
}

metrics::Exposition Scrape(const Coordinator& c) {
  absl::StatusOr<HttpGetResult> r = HttpGet(c.metrics, "/metrics");
  if (!r.ok()) {
    std::fprintf(stderr, "scrape failed: %s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  absl::StatusOr<metrics::Exposition> e = metrics::ParseExposition(r->body);
  if (!e.ok()) {
    std::fprintf(stderr, "bad exposition: %s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(e);
}

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

std::string Latency(std::vector<double> v) {
  return absl::StrFormat("p50 %.3f ms, p99 %.3f ms, max %.3f ms (n=%d)", 1e3 * Percentile(v, 0.5),
                         1e3 * Percentile(v, 0.99), 1e3 * Percentile(v, 1.0), v.size());
}

// Server-side p99 upper bound from the histogram buckets of one method.
std::string ServerP99(const metrics::Exposition& before, const metrics::Exposition& after,
                      const std::string& service, const std::string& method) {
  std::vector<std::pair<double, double>> buckets;  // (le, count delta)
  // prometheus-cpp prints labels sorted by name, le last.
  const std::string prefix = absl::StrCat("recfleet_rpc_duration_seconds_bucket{code=\"OK\",method=\"",
                                          method, "\",service=\"", service, "\",le=\"");
  for (const auto& [key, value] : after.samples) {
    if (key.rfind(prefix, 0) != 0) continue;
    std::string le = key.substr(prefix.size(), key.size() - prefix.size() - 2);
    double bound = le == "+Inf" ? 1e9 : std::stod(le);
    auto it = before.samples.find(key);
    buckets.emplace_back(bound, value - (it == before.samples.end() ? 0 : it->second));
  }
  std::sort(buckets.begin(), buckets.end());
  if (buckets.empty() || buckets.back().second == 0) return "n/a";
  const double total = buckets.back().second;
  for (const auto& [le, count] : buckets) {
    if (count >= 0.99 * total) return absl::StrFormat("<= %.3f ms", le * 1e3);
  }
  return "n/a";
}

void CreateGetPhase(const Coordinator& c) {
  const int threads = absl::GetFlag(FLAGS_create_threads);
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_create_seconds));
  auto channel = grpc::CreateChannel(c.address, Credentials(c));
  auto stub = v1::JobService::NewStub(channel);
  v1::CreateJobRequest request;
  *request.mutable_spec() = coordinator::BuildableSpec(100000);  // Never placed: no workers that many.
  absl::Mutex mu;
  std::vector<double> create_lat, get_lat;
  std::atomic<int64_t> errors{0};
  metrics::Exposition before = Scrape(c);
  const absl::Time start = absl::Now(), end = start + duration;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<double> cl, gl;
      v1::CreateJobRequest req = request;
      for (int64_t i = 0; absl::Now() < end; ++i) {
        req.set_request_id(absl::StrCat("bench-", t, "-", i, "-", absl::ToUnixNanos(start)));
        v1::Job job;
        grpc::ClientContext cctx;
        Authorize(c, kUserToken, &cctx);
        absl::Time t0 = absl::Now();
        grpc::Status s = stub->CreateJob(&cctx, req, &job);
        absl::Time t1 = absl::Now();
        if (!s.ok()) {
          ++errors;
          continue;
        }
        v1::GetJobRequest get;
        get.set_name(job.name());
        v1::Job got;
        grpc::ClientContext gctx;
        Authorize(c, kUserToken, &gctx);
        s = stub->GetJob(&gctx, get, &got);
        absl::Time t2 = absl::Now();
        if (!s.ok()) ++errors;
        cl.push_back(absl::ToDoubleSeconds(t1 - t0));
        gl.push_back(absl::ToDoubleSeconds(t2 - t1));
      }
      absl::MutexLock lock(&mu);
      create_lat.insert(create_lat.end(), cl.begin(), cl.end());
      get_lat.insert(get_lat.end(), gl.begin(), gl.end());
    });
  }
  for (auto& th : pool) th.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  metrics::Exposition after = Scrape(c);
  const double cpu =
      after.samples["process_cpu_seconds_total"] - before.samples["process_cpu_seconds_total"];
  std::printf("== CreateJob+GetJob, %d client threads, %.1f s\n", threads, wall);
  std::printf("pairs/s: %.0f (%zu pairs, %lld errors)\n", create_lat.size() / wall,
              create_lat.size(), static_cast<long long>(errors.load()));
  std::printf("CreateJob client latency: %s; server p99 %s\n", Latency(create_lat).c_str(),
              ServerP99(before, after, "recfleet.v1.JobService", "CreateJob").c_str());
  std::printf("GetJob    client latency: %s; server p99 %s\n", Latency(get_lat).c_str(),
              ServerP99(before, after, "recfleet.v1.JobService", "GetJob").c_str());
  std::printf("coordinator CPU: %.2f s over %.1f s = %.2f cores\n\n", cpu, wall, cpu / wall);
}

struct RateResult {
  double wall = 0, cpu = 0, sent_rate = 0;
  std::vector<double> latency;
  int64_t errors = 0;
};

// Sends `rate` calls per second for warmup + duration; `make_call` issues
// one asynchronous call for index i and invokes `done(ok)` when it ends.
template <typename MakeCall>
RateResult DriveRate(const Coordinator& c, double rate, MakeCall make_call) {
  const int threads = absl::GetFlag(FLAGS_sender_threads);
  const absl::Duration warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup_seconds));
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_seconds));
  absl::Mutex mu;
  RateResult result;
  std::atomic<int64_t> in_flight{0}, errors{0};
  const absl::Time start = absl::Now();
  const absl::Time measure_from = start + warmup, end = measure_from + duration;
  metrics::Exposition before;
  std::atomic<bool> measured{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const double my_rate = rate / threads;
      int64_t sent = 0;
      std::vector<double> local;
      absl::Mutex local_mu;
      while (true) {
        const absl::Time now = absl::Now();
        if (now >= end) break;
        const int64_t due = static_cast<int64_t>(absl::ToDoubleSeconds(now - start) * my_rate);
        for (; sent < due; ++sent) {
          const int64_t index = sent * threads + t;
          const absl::Time t0 = absl::Now();
          const bool record = t0 >= measure_from;
          ++in_flight;
          make_call(index, [&, t0, record](bool ok) {
            if (!ok) ++errors;
            if (record) {
              absl::MutexLock lock(&local_mu);
              local.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
            }
            --in_flight;
          });
        }
        absl::SleepFor(absl::Microseconds(500));
      }
      while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(1));
      absl::MutexLock lock(&mu);
      absl::MutexLock lock2(&local_mu);
      result.latency.insert(result.latency.end(), local.begin(), local.end());
    });
  }
  absl::SleepFor(measure_from - absl::Now());
  before = Scrape(c);
  const absl::Time measure_start = absl::Now();
  absl::SleepFor(end - absl::Now());
  metrics::Exposition after = Scrape(c);
  result.wall = absl::ToDoubleSeconds(absl::Now() - measure_start);
  result.cpu =
      after.samples["process_cpu_seconds_total"] - before.samples["process_cpu_seconds_total"];
  for (auto& th : pool) th.join();
  result.errors = errors.load();
  result.sent_rate = result.latency.size() / absl::ToDoubleSeconds(duration);
  return result;
}

void Report(const char* what, const RateResult& r, const std::string& server_p99) {
  std::printf("%s: %.0f calls/s achieved, %lld errors\n", what, r.sent_rate,
              static_cast<long long>(r.errors));
  std::printf("  client latency: %s; server p99 %s\n", Latency(r.latency).c_str(),
              server_p99.c_str());
  std::printf("  coordinator CPU: %.2f s over %.1f s = %.3f cores\n", r.cpu, r.wall,
              r.cpu / r.wall);
}

void HeartbeatPhase(const Coordinator& c) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const double rate = workers * absl::GetFlag(FLAGS_heartbeat_hz);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < absl::GetFlag(FLAGS_channels); ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // Distinct connections, not one shared subchannel.
    channels.push_back(
        grpc::CreateCustomChannel(c.address, Credentials(c), args));
  }
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  for (auto& ch : channels) stubs.push_back(v1::WorkerService::NewStub(ch));

  // Register every worker (8 threads of blocking calls).
  std::vector<std::string> ids(workers);
  std::vector<std::string> credentials(workers);
  const absl::Time reg_start = absl::Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < workers; i += 8) {
        v1::RegisterWorkerRequest req;
        req.set_host(absl::StrCat("sim-", i));
        req.mutable_topology()->set_node(absl::StrCat("node-", i / 8));
        req.mutable_topology()->set_nvlink_domain(absl::StrCat("nvl-", i / 72));
        req.mutable_topology()->set_zone(absl::StrCat("zone-", i / 2000));
        for (int g = 0; g < 8; ++g) req.add_gpus()->set_index(g);
        v1::RegisterWorkerResponse resp;
        grpc::ClientContext ctx;
        Authorize(c, kWorkerToken, &ctx);
        if (stubs[i % stubs.size()]->RegisterWorker(&ctx, req, &resp).ok()) {
          ids[i] = resp.worker_id();
          credentials[i] = resp.worker_credential();
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("== Heartbeats: %d workers at %.1f Hz (%.0f calls/s), %d sender threads, %d "
              "channels\n",
              workers, absl::GetFlag(FLAGS_heartbeat_hz), rate, absl::GetFlag(FLAGS_sender_threads),
              absl::GetFlag(FLAGS_channels));
  const auto registered = std::count_if(ids.begin(), ids.end(), [](const std::string& id) { return !id.empty(); });
  std::printf("registered %d of %d workers in %.2f s\n", static_cast<int>(registered), workers,
              absl::ToDoubleSeconds(absl::Now() - reg_start));

  metrics::Exposition before = Scrape(c);
  RateResult hb = DriveRate(c, rate, [&](int64_t index, std::function<void(bool)> done) {
    struct Call {
      grpc::ClientContext ctx;
      v1::HeartbeatRequest req;
      v1::HeartbeatResponse resp;
    };
    auto* call = new Call;
    call->req.set_worker_id(ids[index % workers]);
    call->req.set_worker_credential(credentials[index % workers]);
    Authorize(c, kWorkerToken, &call->ctx);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    stubs[index % stubs.size()]->async()->Heartbeat(
        &call->ctx, &call->req, &call->resp, [call, done](grpc::Status s) {
          done(s.ok());
          delete call;
        });
  });
  metrics::Exposition after = Scrape(c);
  Report("Heartbeat", hb, ServerP99(before, after, "recfleet.v1.WorkerService", "Heartbeat"));

  // Baseline: the gRPC health check of the same server at the same rate.
  std::vector<std::unique_ptr<grpc::GenericStub>> generic;
  for (auto& ch : channels) generic.push_back(std::make_unique<grpc::GenericStub>(ch));
  const std::string health_req("\x0a\x16recfleet.v1.JobService", 24);
  RateResult base = DriveRate(c, rate, [&](int64_t index, std::function<void(bool)> done) {
    struct Call {
      grpc::ClientContext ctx;
      grpc::ByteBuffer req, resp;
    };
    auto* call = new Call;
    grpc::Slice slice(health_req);
    call->req = grpc::ByteBuffer(&slice, 1);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    generic[index % generic.size()]->UnaryCall(&call->ctx, "/grpc.health.v1.Health/Check",
                                               grpc::StubOptions(), &call->req, &call->resp,
                                               [call, done](grpc::Status s) {
                                                 done(s.ok());
                                                 delete call;
                                               });
  });
  Report("Baseline grpc.health.v1.Health/Check", base, "n/a (not instrumented)");
  std::printf("Heartbeat CPU / health-check CPU at the same rate: %.2fx\n\n",
              (hb.cpu / hb.wall) / (base.cpu / base.wall));
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The coordinator's own heartbeat logic without gRPC: what a heartbeat costs
// on top of the transport (compare with the health-check baseline above).
void InProcessHeartbeats() {
  const int workers = absl::GetFlag(FLAGS_workers);
  metrics::MetricRegistry registry;
  auto store = coordinator::JobStore::Open(":memory:");
  coordinator::CoordinatorOptions options;
  options.lease = absl::Seconds(600);
  auto c = coordinator::Coordinator::Create(*std::move(store), options, &registry);
  std::vector<v1::RegisterWorkerResponse> registered;
  for (int i = 0; i < workers; ++i) {
    v1::RegisterWorkerRequest req;
    req.set_host(absl::StrCat("sim-", i));
    req.mutable_topology()->set_node(absl::StrCat("node-", i / 8));
    registered.push_back(*(*c)->RegisterWorker(req));
  }
  // One running job on 64 of the workers, so some heartbeats carry a task.
  v1::CreateJobRequest create;
  *create.mutable_spec() = coordinator::BuildableSpec(64);
  const std::string job = (*c)->CreateJob(create)->name();
  std::vector<v1::HeartbeatRequest> requests(workers);
  for (int i = 0; i < workers; ++i) {
    requests[i].set_worker_id(registered[i].worker_id());
    requests[i].set_worker_credential(registered[i].worker_credential());
    v1::HeartbeatResponse r = *(*c)->Heartbeat(requests[i]);
    for (const auto& cmd : r.commands()) {
      if (!cmd.has_assignment()) continue;
      requests[i].mutable_task()->set_job(job);
      requests[i].mutable_task()->set_restart_epoch(cmd.assignment().restart_epoch());
      requests[i].mutable_task()->set_phase(v1::TaskStatus::RUNNING);
    }
  }
  const int64_t calls = std::max<int64_t>(workers, 1) * 50;
  std::vector<double> lat;
  lat.reserve(calls);
  const double cpu0 = ThreadCpuSeconds();
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < calls; ++i) {
    const absl::Time s = absl::Now();
    absl::StatusOr<v1::HeartbeatResponse> r = (*c)->Heartbeat(requests[i % workers]);
    lat.push_back(absl::ToDoubleSeconds(absl::Now() - s));
    if (!r.ok()) std::exit(1);
  }
  const double cpu = ThreadCpuSeconds() - cpu0;
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  std::printf("== Coordinator::Heartbeat in process (no gRPC), %d workers, %lld calls\n", workers,
              static_cast<long long>(calls));
  std::printf("%.2f us CPU per heartbeat (%.0f calls/s on one thread, wall %.2f s); at %d/s: %.4f "
              "cores\n",
              1e6 * cpu / calls, calls / wall, wall, workers, cpu / calls * workers);
  std::printf("latency: %s\n\n", Latency(lat).c_str());
}

}  // namespace
}  // namespace recfleet

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char dir_template[] = "/tmp/recfleet-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  recfleet::Coordinator c = recfleet::StartCoordinator(dir);
  if (c.address.empty() || c.metrics.empty()) {
    std::fprintf(stderr, "coordinator did not start; see %s/coordinator.log\n", dir.c_str());
    return 1;
  }
  std::printf("coordinator %s (metrics %s), db in %s, %u hardware threads, %s\n\n", c.address.c_str(),
              c.metrics.c_str(), dir.c_str(), std::thread::hardware_concurrency(),
              c.tls_dir.empty() ? "plain text, no tokens" : "TLS, users' and workers' tokens");
  if (absl::GetFlag(FLAGS_workers) > 0) recfleet::InProcessHeartbeats();
  if (absl::GetFlag(FLAGS_create_seconds) > 0) recfleet::CreateGetPhase(c);
  kill(c.pid, SIGTERM);
  waitpid(c.pid, nullptr, 0);
  if (absl::GetFlag(FLAGS_workers) > 0) {
    // A fresh coordinator (and database), so queued jobs from the first
    // phase do not weigh on the heartbeat measurement.
    const std::string dir2 = dir + "/heartbeats";
    mkdir(dir2.c_str(), 0700);
    c = recfleet::StartCoordinator(dir2);
    if (c.address.empty() || c.metrics.empty()) {
      std::fprintf(stderr, "coordinator did not start; see %s/coordinator.log\n", dir2.c_str());
      return 1;
    }
    recfleet::HeartbeatPhase(c);
    kill(c.pid, SIGTERM);
    waitpid(c.pid, nullptr, 0);
  }
  return 0;
}
