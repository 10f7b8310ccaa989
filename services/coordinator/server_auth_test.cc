// Users and workers hold different credentials. A coordinator with both
// tokens, attacked over gRPC: the users' token registers no worker and
// opens no WorkerService call (not even with a stolen worker id and
// credential); the workers' token, and a worker's own credential, open no
// JobService call.

#include <future>
#include <map>
#include <memory>
#include <string>

#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recfleet/v1/job_service.grpc.pb.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "services/coordinator/server.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

constexpr char kUserToken[] = "user-token";
constexpr char kWorkerToken[] = "worker-token";

void Bearer(const std::string& token, grpc::ClientContext* context) {
  context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

class ServerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.auth_token = kUserToken;
    options.worker_token = kWorkerToken;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  grpc::Status Register(const std::string& token, v1::RegisterWorkerResponse* response) {
    grpc::ClientContext context;
    Bearer(token, &context);
    v1::RegisterWorkerRequest request;
    request.set_host("host-a");
    return workers_->RegisterWorker(&context, request, response);
  }

  grpc::Status Heartbeat(const std::string& token, const v1::RegisterWorkerResponse& worker) {
    grpc::ClientContext context;
    Bearer(token, &context);
    v1::HeartbeatRequest request;
    request.set_worker_id(worker.worker_id());
    request.set_worker_credential(worker.worker_credential());
    v1::HeartbeatResponse response;
    return workers_->Heartbeat(&context, request, &response);
  }

  grpc::Status CreateJob(const std::string& token) {
    grpc::ClientContext context;
    Bearer(token, &context);
    v1::CreateJobRequest request;
    *request.mutable_spec() = BuildableSpec(1);
    v1::Job job;
    return jobs_->CreateJob(&context, request, &job);
  }

  grpc::StatusCode WatchJob(const std::string& token) {
    grpc::ClientContext context;
    Bearer(token, &context);
    v1::WatchJobRequest request;
    request.set_name("jobs/any");
    auto reader = jobs_->WatchJob(&context, request);
    v1::WatchJobResponse event;
    while (reader->Read(&event)) {
    }
    return reader->Finish().error_code();
  }

  // Every method of `service_name` called with `token` and an empty
  // request, so a method added later is covered too.
  std::map<std::string, grpc::StatusCode> CallEveryMethod(const std::string& service_name,
                                                          const std::string& token) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_name);
    EXPECT_NE(service, nullptr) << service_name;
    std::map<std::string, grpc::StatusCode> codes;
    if (service == nullptr) return codes;
    grpc::GenericStub stub(channel_);
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method = "/" + service->full_name() + "/" + service->method(i)->name();
      grpc::ClientContext context;
      Bearer(token, &context);
      grpc::Slice empty("");
      grpc::ByteBuffer request(&empty, 1);
      if (service->method(i)->server_streaming()) {
        codes[method] = WatchJob(token);  // The one streaming method.
        EXPECT_EQ(service->method(i)->name(), "WatchJob");
        continue;
      }
      grpc::ByteBuffer response;
      std::promise<grpc::Status> done;
      stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                     [&done](grpc::Status s) { done.set_value(s); });
      codes[method] = done.get_future().get().error_code();
    }
    return codes;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST(ServerTokensTest, StartRefusesOneTokenWithoutTheOtherAndOneTokenForBoth) {
  for (const auto& [user, worker] : std::vector<std::pair<std::string, std::string>>{
           {kUserToken, ""}, {"", kWorkerToken}, {"same", "same"}}) {
    ServerOptions options;
    options.auth_token = user;
    options.worker_token = worker;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << "user '" << user << "', worker '" << worker << "'";
  }
}

TEST_F(ServerAuthTest, TheUsersTokenRegistersNoWorker) {
  v1::RegisterWorkerResponse worker;
  EXPECT_EQ(Register(kUserToken, &worker).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(Register(kWorkerToken, &worker).ok());
  EXPECT_FALSE(worker.worker_credential().empty());
}

TEST_F(ServerAuthTest, TheUsersTokenCannotSpeakForAWorkerEvenWithItsCredential) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kWorkerToken, &worker).ok());
  EXPECT_EQ(Heartbeat(kUserToken, worker).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Heartbeat(kWorkerToken, worker).ok());
}

TEST_F(ServerAuthTest, WorkerCredentialsOpenNoJobCall) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kWorkerToken, &worker).ok());
  EXPECT_EQ(CreateJob(kWorkerToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CreateJob(worker.worker_credential()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CreateJob(kUserToken).ok());
}

TEST_F(ServerAuthTest, EveryJobMethodRefusesWorkersAndEveryWorkerMethodRefusesUsers) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kWorkerToken, &worker).ok());
  for (const std::string& token : {std::string(kWorkerToken), worker.worker_credential()}) {
    for (const auto& [method, code] : CallEveryMethod("recfleet.v1.JobService", token)) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << method;
    }
  }
  const auto user_calls = CallEveryMethod("recfleet.v1.WorkerService", kUserToken);
  EXPECT_GE(user_calls.size(), 6u);
  for (const auto& [method, code] : user_calls) {
    EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << method;
  }
}

}  // namespace
}  // namespace recfleet::coordinator
