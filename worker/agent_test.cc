#include "worker/agent.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

// A WorkerService that follows the heartbeat contract with scripted
// commands: it repeats `pending` until a heartbeat reports its
// (job, epoch), and records every task status it receives.
class ScriptedCoordinator final : public v1::WorkerService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    absl::MutexLock lock(&mu);
    registrations.push_back(req->worker_id());
    resp->set_worker_id(req->worker_id().empty() ? "w-1" : req->worker_id());
    // A new credential per registration, as the coordinator draws them.
    credential = "credential-" + std::to_string(registrations.size());
    resp->set_worker_credential(credential);
    resp->set_lease_seconds(5);
    resp->set_heartbeat_interval_seconds(0.02);
    forget = false;
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    absl::MutexLock lock(&mu);
    if (forget) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    if (req->worker_credential() != credential) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong worker_credential");
    }
    statuses.push_back(req->task());
    if (pending.has_assignment() && req->task().job() == pending.assignment().job() &&
        req->task().restart_epoch() == pending.assignment().restart_epoch()) {
      pending.Clear();
    }
    if (pending.command_case() != v1::WorkerCommand::COMMAND_NOT_SET) *resp->add_commands() = pending;
    if (pending.has_abort()) pending.Clear();
    return grpc::Status::OK;
  }
  grpc::Status ReportStep(grpc::ServerContext*, const v1::ReportStepRequest*, v1::ReportStepResponse*) override {
    return grpc::Status::OK;
  }

  // Blocks until some heartbeat reported `phase` for (job, epoch).
  bool WaitForPhase(const std::string& job, int64_t epoch, v1::TaskStatus::Phase phase) {
    auto seen = [&] {
      for (const auto& s : statuses) {
        if (s.job() == job && s.restart_epoch() == epoch && s.phase() == phase) return true;
      }
      return false;
    };
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(10));
  }
  // Blocks until a heartbeat after this call reports the worker idle.
  bool WaitForIdle() {
    absl::MutexLock lock(&mu);
    const size_t from = statuses.size();
    auto idle = [&] {
      for (size_t i = from; i < statuses.size(); ++i) {
        if (statuses[i].job().empty()) return true;
      }
      return false;
    };
    return mu.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  }

  absl::Mutex mu;
  v1::WorkerCommand pending ABSL_GUARDED_BY(mu);
  bool forget ABSL_GUARDED_BY(mu) = false;
  std::vector<std::string> registrations ABSL_GUARDED_BY(mu);
  std::string credential ABSL_GUARDED_BY(mu);
  std::vector<v1::TaskStatus> statuses ABSL_GUARDED_BY(mu);
};

// Counts runs per epoch; epoch 1 trains until stopped, others finish at once.
class CountingRunner : public TaskRunner {
 public:
  absl::Status Run(const v1::Assignment& a, TaskControl& control) override {
    runs.fetch_add(1);
    control.SetRunning();
    if (a.restart_epoch() == 1) {
      std::atomic<bool> aborted{false};
      control.OnStop([&] { aborted = true; });
      control.WaitForStop(absl::Seconds(30));
      EXPECT_TRUE(aborted.load());
      return absl::CancelledError("stopped");
    }
    return absl::OkStatus();
  }
  std::atomic<int> runs{0};
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    AgentOptions options;
    options.registration.set_host("127.0.0.1");
    agent_ = std::make_unique<Agent>(v1::WorkerService::NewStub(channel), options, &runner_);
    thread_ = std::thread([this] { ASSERT_TRUE(agent_->Run().ok()); });
  }
  void TearDown() override {
    agent_->Stop();
    thread_.join();
    server_->Shutdown();
  }
  void Assign(int64_t epoch) {
    absl::MutexLock lock(&coordinator_.mu);
    v1::Assignment* a = coordinator_.pending.mutable_assignment();
    a->set_job("jobs/j1");
    a->set_restart_epoch(epoch);
    a->set_world_size(1);
  }

  ScriptedCoordinator coordinator_;
  CountingRunner runner_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Agent> agent_;
  std::thread thread_;
};

TEST_F(AgentTest, RunsAnAssignmentOnceAndReportsSuccess) {
  Assign(0);
  ASSERT_TRUE(coordinator_.WaitForPhase("jobs/j1", 0, v1::TaskStatus::SUCCEEDED));
  EXPECT_EQ(runner_.runs.load(), 1);
}

TEST_F(AgentTest, AbortStopsTheTaskAndANewEpochStartsAgain) {
  Assign(1);
  ASSERT_TRUE(coordinator_.WaitForPhase("jobs/j1", 1, v1::TaskStatus::RUNNING));
  {
    absl::MutexLock lock(&coordinator_.mu);
    v1::Abort* abort = coordinator_.pending.mutable_abort();
    abort->set_job("jobs/j1");
    abort->set_restart_epoch(1);
  }
  ASSERT_TRUE(coordinator_.WaitForIdle());
  Assign(2);
  ASSERT_TRUE(coordinator_.WaitForPhase("jobs/j1", 2, v1::TaskStatus::SUCCEEDED));
  EXPECT_EQ(runner_.runs.load(), 2);
}

TEST_F(AgentTest, ReRegistersUnderTheSameIdAfterLosingItsLease) {
  Assign(0);
  ASSERT_TRUE(coordinator_.WaitForPhase("jobs/j1", 0, v1::TaskStatus::SUCCEEDED));
  {
    absl::MutexLock lock(&coordinator_.mu);
    coordinator_.forget = true;
  }
  absl::MutexLock lock(&coordinator_.mu);
  auto reregistered = [&] { return coordinator_.registrations.size() >= 2; };
  ASSERT_TRUE(coordinator_.mu.AwaitWithTimeout(absl::Condition(&reregistered), absl::Seconds(10)));
  EXPECT_EQ(coordinator_.registrations[0], "");
  EXPECT_EQ(coordinator_.registrations[1], "w-1");
}

}  // namespace
}  // namespace recfleet::worker
