// The recfleet CLI against a real coordinator process on loopback: auth,
// submit (idempotent by request id), bad specs, get/list/watch/cancel, exit
// codes, health and reflection, /metrics, and a coordinator killed with
// SIGKILL and restarted on the same database losing nothing.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "services/common/exposition.h"
#include "services/common/generic_call_testing.h"
#include "services/common/http_get.h"

namespace recfleet {
namespace {

using ::recfleet::testing::GenericCall;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together.
};

Result RunShell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A coordinator process; killed (SIGKILL) by Kill() or the destructor.
class CoordinatorProcess {
 public:
  // `listen` "127.0.0.1:0" picks a port; a restart passes the old address.
  explicit CoordinatorProcess(const std::string& token_file,
                              const std::string& listen = "127.0.0.1:0") {
    const std::string dir = TmpDir();
    std::remove((dir + "/address").c_str());
    log_ = dir + "/coordinator.log";
    // The workers' token; the users' is in `token_file`.
    std::ofstream(dir + "/worker-token") << "w0rker\n";
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_.c_str(), "a", stdout);
      (void)f;
      dup2(fileno(stdout), 2);
      execl(Runfile("services/coordinator/recfleet-coordinator").c_str(), "recfleet-coordinator",
            ("--listen=" + listen).c_str(), ("--db=" + dir + "/jobs.db").c_str(),
            "--metrics_address=127.0.0.1:0", ("--address_file=" + dir + "/address").c_str(),
            ("--auth_token_file=" + token_file).c_str(),
            ("--worker_token_file=" + dir + "/worker-token").c_str(), "--lease_seconds=5", nullptr);
      _exit(127);
    }
    for (int i = 0; i < 200 && address_.empty(); ++i) {
      std::string a = ReadFile(dir + "/address");
      if (!a.empty()) address_ = a.substr(0, a.find('\n'));
      absl::SleepFor(absl::Milliseconds(25));
    }
    // The metrics line is printed before the address file is written.
    for (absl::string_view line : absl::StrSplit(ReadFile(log_), '\n')) {
      size_t at = line.find("http://");
      if (at != std::string::npos) {
        metrics_ = std::string(line.substr(at + 7, line.find("/metrics") - at - 7));
      }
    }
  }
  ~CoordinatorProcess() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  const std::string& address() const { return address_; }
  const std::string& metrics() const { return metrics_; }

 private:
  pid_t pid_ = -1;
  std::string log_, address_, metrics_;
};

class CoordinatorCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = TmpDir() + "/token";
    std::ofstream(token_file_) << "t0ken\n";
    coordinator_ = std::make_unique<CoordinatorProcess>(token_file_);
    ASSERT_FALSE(coordinator_->address().empty()) << ReadFile(TmpDir() + "/coordinator.log");
  }

  Result Cli(const std::string& args, bool with_token = true) {
    return RunShell(absl::StrCat(with_token ? "RECFLEET_AUTH_TOKEN=t0ken " : "",
                            "RECFLEET_COORDINATOR=", coordinator_->address(), " ",
                            Runfile("cli/recfleet"), " ", args));
  }

  // The job name printed by `recfleet submit`.
  static std::string SubmittedName(const Result& r) {
    return r.output.substr(0, r.output.find(' '));
  }

  std::unique_ptr<v1::WorkerService::Stub> WorkerStub() {
    return v1::WorkerService::NewStub(
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials()));
  }

  std::string token_file_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
};

TEST_F(CoordinatorCliTest, EndToEnd) {
  const std::string example = Runfile("deploy/examples/job-gemlite.yaml");

  // Authentication: no token, no service.
  Result r = Cli("list", /*with_token=*/false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;

  // Submit twice with one request id: one job.
  r = Cli("submit " + example + " --request-id demo-1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string job = SubmittedName(r);
  ASSERT_EQ(job.rfind("jobs/", 0), 0u) << r.output;
  r = Cli("submit " + example + " --request-id demo-1");
  EXPECT_EQ(SubmittedName(r), job) << r.output;
  r = Cli("list --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<absl::string_view> parts = absl::StrSplit(r.output, "\"name\": \"jobs/");
  EXPECT_EQ(parts.size(), 2u) << r.output;  // Exactly one job.

  // A bad spec: rejected with the field path, nothing created.
  std::string bad = TmpDir() + "/bad.yaml";
  {
    std::string text = ReadFile(example);
    size_t at = text.find("dim: 32");
    text.replace(at, 7, "dim: 0");
    std::ofstream(bad, std::ios::trunc) << text;
  }
  r = Cli("submit " + bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // From the google.rpc.BadRequest detail: a count, then one line per field.
  EXPECT_NE(r.output.find("INVALID_ARGUMENT: 1 problem:\n  spec.model.tables[0].dim must be > 0, "
                          "got 0"),
            std::string::npos)
      << r.output;
  r = Cli("submit /nonexistent.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;

  r = Cli("get " + job);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("state:         QUEUED (Submitted)"), std::string::npos) << r.output;
  EXPECT_EQ(Cli("get jobs/doesnotexist").exit_code, 4);
  EXPECT_EQ(Cli("get " + job + " --coordinator 127.0.0.1:1 --timeout 2").exit_code, 3);
  EXPECT_EQ(Cli("get").exit_code, 2);
  EXPECT_EQ(Cli("list --state BOGUS").exit_code, 2);

  // The users' token registers no worker.
  auto stub = WorkerStub();
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer t0ken");
    v1::RegisterWorkerRequest req;
    req.set_host("host-impostor");
    v1::RegisterWorkerResponse resp;
    EXPECT_EQ(stub->RegisterWorker(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Two workers register: the gang is placed and assignments flow.
  std::vector<std::string> workers;
  std::map<std::string, std::string> credentials;
  for (const char* host : {"host-a", "host-b"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer w0rker");
    v1::RegisterWorkerRequest req;
    req.set_host(host);
    v1::RegisterWorkerResponse resp;
    ASSERT_TRUE(stub->RegisterWorker(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.lease_seconds(), 5);
    workers.push_back(resp.worker_id());
    credentials[resp.worker_id()] = resp.worker_credential();
  }
  // One heartbeat of worker `w`, reporting `task` when given.
  auto beat = [&](const std::string& w, const v1::TaskStatus* task, v1::HeartbeatResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer w0rker");
    v1::HeartbeatRequest req;
    req.set_worker_id(w);
    req.set_worker_credential(credentials[w]);
    if (task != nullptr) *req.mutable_task() = *task;
    return stub->Heartbeat(&ctx, req, resp);
  };
  int64_t epoch = 0;
  for (const std::string& w : workers) {
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(beat(w, nullptr, &resp).ok());
    ASSERT_EQ(resp.commands_size(), 1);
    EXPECT_EQ(resp.commands(0).assignment().job(), job);
    epoch = resp.commands(0).assignment().restart_epoch();
  }
  v1::TaskStatus running;
  running.set_job(job);
  running.set_restart_epoch(epoch);
  running.set_phase(v1::TaskStatus::RUNNING);
  for (const std::string& w : workers) {
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(beat(w, &running, &resp).ok());
  }
  r = Cli("list");
  EXPECT_NE(r.output.find("RUNNING"), std::string::npos) << r.output;
  // The same job as YAML and as JSON (-o and --output, --json = -o json).
  r = Cli("get " + job + " -o yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("name: " + job), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("state: RUNNING"), std::string::npos) << r.output;
  r = Cli("list --output json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"state\": \"RUNNING\""), std::string::npos) << r.output;
  EXPECT_EQ(Cli("list --json").output, r.output);
  r = Cli("get " + job + " -o xml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("-o must be table, json or yaml"), std::string::npos) << r.output;

  // watch follows the job until the CLI cancels it.
  Result watched;
  std::thread watcher([&] { watched = Cli("watch " + job); });
  absl::SleepFor(absl::Milliseconds(300));
  r = Cli("cancel " + job + " --reason 'end of test'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("CANCELLED"), std::string::npos);
  watcher.join();
  EXPECT_EQ(watched.exit_code, 1) << watched.output;  // Cancelled, not succeeded.
  EXPECT_NE(watched.output.find("CANCELLED   CancelledByUser: end of test"), std::string::npos)
      << watched.output;

  // Health and reflection answer without a token.
  std::string health;
  grpc::Status hs = GenericCall(coordinator_->address(), "/grpc.health.v1.Health/Check",
                                std::string("\x0a\x16recfleet.v1.JobService", 24), &health);
  ASSERT_TRUE(hs.ok()) << hs.error_message();
  EXPECT_EQ(health, std::string("\x08\x01", 2));  // SERVING
  std::string services;
  grpc::Status rs = GenericCall(coordinator_->address(),
                                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                std::string("\x3a\x00", 2), &services);
  ASSERT_TRUE(rs.ok()) << rs.error_message();
  EXPECT_NE(services.find("recfleet.v1.JobService"), std::string::npos);
  EXPECT_NE(services.find("recfleet.v1.WorkerService"), std::string::npos);

  // /metrics parses and counts what happened.
  absl::StatusOr<HttpGetResult> scrape = HttpGet(coordinator_->metrics(), "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status() << " metrics at '" << coordinator_->metrics() << "'";
  absl::StatusOr<metrics::Exposition> e = metrics::ParseExposition(scrape->body);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->samples.at("recfleet_jobs{state=\"CANCELLED\"}"), 1);
  EXPECT_EQ(e->samples.at("recfleet_workers{state=\"idle\"}"), 2);
  EXPECT_EQ(e->samples.at("recfleet_jobs_created_total"), 1);
  EXPECT_GE(e->samples.at("recfleet_rpc_duration_seconds_count{code=\"INVALID_ARGUMENT\","
                          "method=\"CreateJob\",service=\"recfleet.v1.JobService\"}"),
            1);
  EXPECT_GE(e->samples.at("recfleet_rpc_duration_seconds_count{code=\"UNAUTHENTICATED\","
                          "method=\"ListJobs\",service=\"recfleet.v1.JobService\"}"),
            1);

  // The status page on the metrics address lists the job.
  absl::StatusOr<HttpGetResult> status_page = HttpGet(coordinator_->metrics(), "/status");
  ASSERT_TRUE(status_page.ok()) << status_page.status();
  EXPECT_NE(status_page->body.find("<h1>recfleet coordinator</h1>"), std::string::npos);
  EXPECT_NE(status_page->body.find(job), std::string::npos) << status_page->body.substr(0, 2000);

  // The workers, their leases renewed first (the CLI calls above may have
  // used most of the 5 s on a busy machine), then the job's recorded state
  // changes.
  for (const std::string& w : workers) {
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(beat(w, nullptr, &resp).ok());
  }
  r = Cli("workers");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("WORKER ", 0), 0u) << r.output;
  for (const std::string& w : workers) EXPECT_NE(r.output.find(w), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("host-b"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("IDLE"), std::string::npos) << r.output;
  r = Cli("workers -o json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"host\": \"host-a\""), std::string::npos) << r.output;
  EXPECT_EQ(Cli("workers", /*with_token=*/false).exit_code, 1);
  r = Cli("events " + job);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("QUEUED      SCHEDULING"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SCHEDULING  RUNNING"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("RUNNING     CANCELLED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CancelledByUser"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("end of test"), std::string::npos) << r.output;
  r = Cli("events " + job + " -o yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("to: CANCELLED"), std::string::npos) << r.output;
  EXPECT_EQ(Cli("events jobs/doesnotexist").exit_code, 4);

  // A second job, then the coordinator dies hard and comes back on its db.
  r = Cli("submit " + example);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string second = SubmittedName(r);
  coordinator_->Kill();
  coordinator_ = std::make_unique<CoordinatorProcess>(token_file_);
  ASSERT_FALSE(coordinator_->address().empty());
  r = Cli("get " + job);
  EXPECT_NE(r.output.find("state:         CANCELLED (CancelledByUser: end of test)"),
            std::string::npos)
      << r.output;
  r = Cli("get " + second + " --json");
  EXPECT_NE(r.output.find("\"state\": \"QUEUED\""), std::string::npos) << r.output;
  r = Cli("list --state cancelled --state queued");
  EXPECT_NE(r.output.find(job), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(second), std::string::npos) << r.output;

  // Only finished jobs can be deleted.
  r = Cli("delete " + second);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("FAILED_PRECONDITION"), std::string::npos) << r.output;
  r = Cli("delete " + job);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(job + " deleted"), std::string::npos) << r.output;
  EXPECT_EQ(Cli("get " + job).exit_code, 4);
  EXPECT_EQ(Cli("delete " + job).exit_code, 4);
}

// `recfleet plan --coordinator` asks the running coordinator's planner
// (JobService.PlanJob) on the workers registered now, with the same flags
// as the job commands.
// `recfleet watch` outlives a coordinator restart: it reconnects to the
// restarted coordinator (same address, same database) and ends when the job
// does, with the job's exit code.
TEST_F(CoordinatorCliTest, WatchReconnectsAcrossACoordinatorRestart) {
  Result r = Cli("submit " + Runfile("deploy/examples/job-gemlite.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string job = SubmittedName(r);
  const std::string out = TmpDir() + "/watch.out";
  std::remove(out.c_str());
  const std::string address = coordinator_->address();
  // In the background; its exit code is appended when it ends.
  ASSERT_EQ(std::system(absl::StrCat("(RECFLEET_AUTH_TOKEN=t0ken RECFLEET_COORDINATOR=", address, " ",
                                     Runfile("cli/recfleet"), " watch ", job, " >", out,
                                     " 2>&1; echo \"exit=$?\" >>", out, ") &")
                            .c_str()),
            0);
  auto wait_for = [&](const std::string& text) {
    for (int i = 0; i < 400; ++i) {
      if (ReadFile(out).find(text) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_for("QUEUED")) << ReadFile(out);

  coordinator_->Kill();
  absl::SleepFor(absl::Seconds(1.5));  // The watch notices and backs off.
  coordinator_ = std::make_unique<CoordinatorProcess>(token_file_, address);
  ASSERT_EQ(coordinator_->address(), address) << ReadFile(TmpDir() + "/coordinator.log");
  ASSERT_TRUE(wait_for("reconnecting")) << ReadFile(out);
  EXPECT_EQ(ReadFile(out).find("exit="), std::string::npos) << "watch ended at the restart:\n"
                                                            << ReadFile(out);

  r = Cli("cancel " + job + " --reason test");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(wait_for("exit=")) << ReadFile(out);
  const std::string text = ReadFile(out);
  EXPECT_NE(text.find("CANCELLED"), std::string::npos) << text;
  EXPECT_NE(text.find("exit=1"), std::string::npos) << text;  // Cancelled: 1.
  // The QUEUED snapshot after reconnecting is not printed again.
  EXPECT_EQ(text.find("QUEUED"), text.rfind("QUEUED")) << text;
}

TEST_F(CoordinatorCliTest, PlanOnTheCoordinator) {
  const std::string example = Runfile("deploy/examples/job-gemlite.yaml");
  const std::string flags = absl::StrCat(" --coordinator ", coordinator_->address());
  Result r = Cli("plan " + example + flags, /*with_token=*/false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;

  // No workers yet: the coordinator says what is missing.
  r = Cli("plan " + example + flags + " --auth-token-file " + token_file_, false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("spec.resources.workers"), std::string::npos) << r.output;

  auto stub = WorkerStub();
  for (const char* host : {"host-a", "host-b"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer w0rker");
    v1::RegisterWorkerRequest req;
    req.set_host(host);
    v1::RegisterWorkerResponse resp;
    ASSERT_TRUE(stub->RegisterWorker(&ctx, req, &resp).ok());
  }
  r = Cli("plan " + example + flags + " --auth-token-file " + token_file_, false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on 2 worker(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dense mesh (2D FSDP)"), std::string::npos) << r.output;
  r = Cli("plan " + example + flags + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("{", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("\"decisions\""), std::string::npos) << r.output;

  // Hints reach the coordinator's planner; impossible ones name the field.
  std::string hinted = TmpDir() + "/hinted.yaml";
  std::string text = ReadFile(example);
  text.replace(text.find("parallelism: {}"), 15, "parallelism: {fsdp_group_size: 1}");
  std::ofstream(hinted, std::ios::trunc) << text;
  r = Cli("plan " + hinted + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("set by the job's hints (parallelism.fsdp_group_size = 1)"),
            std::string::npos)
      << r.output;
  text.replace(text.find("fsdp_group_size: 1"), 18, "fsdp_group_size: 3");
  std::ofstream(hinted, std::ios::trunc) << text;
  r = Cli("plan " + hinted + flags);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("spec.parallelism.fsdp_group_size"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace recfleet
