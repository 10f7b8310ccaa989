// PlanJob over gRPC against an in-process coordinator on 127.0.0.1:0.

#include <memory>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recfleet/v1/job_service.grpc.pb.h"
#include "services/coordinator/server.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

class PlanJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    for (const char* host : {"host-a", "host-b"}) {
      ::recfleet::v1::RegisterWorkerRequest r;
      r.set_host(host);
      r.mutable_topology()->set_node(host);
      r.mutable_topology()->set_zone("z1");
      ASSERT_TRUE(server_->coordinator()->RegisterWorker(r).ok());
    }
    stub_ = ::recfleet::v1::JobService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Plan(const ::recfleet::v1::JobSpec& spec, ::recfleet::v1::PlanJobResponse* out) {
    ::recfleet::v1::PlanJobRequest request;
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    return stub_->PlanJob(&context, request, out);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<::recfleet::v1::JobService::Stub> stub_;
};

TEST_F(PlanJobTest, ReturnsThePlanWithExplanations) {
  ::recfleet::v1::PlanJobResponse response;
  grpc::Status status = Plan(ValidSpec(2), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const ::recfleet::v1::Plan& plan = response.plan();
  EXPECT_EQ(plan.world_size(), 2);
  EXPECT_EQ(plan.local_batch_size(), 256);
  EXPECT_EQ(plan.dense().fsdp_group_size() * plan.dense().replicas(), 2);
  ASSERT_EQ(plan.sparse().tables_size(), 2);
  EXPECT_EQ(plan.sparse().tables(0).table(), "items");
  EXPECT_FALSE(plan.decisions().empty());
  EXPECT_FALSE(plan.decisions(0).reason().empty());
  EXPECT_GT(plan.step().total_seconds(), 0);
  EXPECT_GT(plan.peak_memory().total_bytes(), 0);
  EXPECT_LE(plan.peak_memory().total_bytes(), plan.hbm_usable_bytes());
  EXPECT_NE(plan.summary().find("plan: FSDP"), std::string::npos);
  // A CPU job (ValidSpec's): no GPU memory in its summary; this coordinator
  // has no CPU rate table to predict the rank's.
  EXPECT_NE(plan.summary().find("peak per CPU rank not predicted"), std::string::npos) << plan.summary();
  EXPECT_EQ(plan.summary().find("GPU"), std::string::npos) << plan.summary();
  EXPECT_FALSE(response.report().empty());
  EXPECT_EQ(response.workers_size(), 2);
}

TEST_F(PlanJobTest, NothingFitsIsFailedPreconditionWithThePlannersMessage) {
  auto spec = ValidSpec(2);
  spec.mutable_model()->mutable_tables(1)->set_rows(4000000000);
  spec.mutable_model()->mutable_tables(1)->set_dim(512);
  ::recfleet::v1::PlanJobResponse response;
  grpc::Status status = Plan(spec, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("users"), std::string::npos) << status.error_message();
}

TEST_F(PlanJobTest, BadSpecIsInvalidArgumentNamingTheField) {
  auto spec = ValidSpec(2);
  spec.mutable_model()->mutable_tables(1)->set_dim(0);
  ::recfleet::v1::PlanJobResponse response;
  grpc::Status status = Plan(spec, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("spec.model.tables[1].dim"), std::string::npos);
}

}  // namespace
}  // namespace recfleet::coordinator
