// A data loader started with a bearer token, a data-grant key and TLS serves
// only callers that present the token, and a job's data only to callers
// presenting that job's grant: training batches are not for anyone who
// connects, nor for the workers of another job.

#include <future>
#include <memory>
#include <string>

#include "data/loader.h"
#include "data/synth.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/data_grant.h"
#include "services/common/generic_call_testing.h"
#include "services/common/tls.h"
#include "services/common/tls_testing.h"
#include "services/dataloader/client.h"
#include "services/dataloader/server.h"

namespace recfleet::dataloader {
namespace {

constexpr char kToken[] = "loader-test-token";
constexpr char kGrantKey[] = "loader-test-grant-key";

class ServerAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(::testing::TempDir()) + "/auth_data");
    data::SynthOptions o;
    o.samples = 600;
    o.lengths = *data::LengthDistribution::Parse("lognormal:mean=10,sigma=1,min=0,max=100");
    o.num_items = 500;
    o.rows_per_block = 64;
    ASSERT_TRUE(data::GenerateSynthetic(o, *dir_).ok());
    auto certs = testing::MakeTestCerts("loader_certs");
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new testing::TestCerts(*certs);
  }

  void SetUp() override {
    ServerOptions so;
    so.metrics_port = -1;
    so.auth_token = kToken;
    so.data_grant_key = kGrantKey;
    absl::StatusOr<ServerTransport> transport = MakeServerTransport(certs_->Server(), so.host);
    ASSERT_TRUE(transport.ok()) << transport.status();
    so.credentials = transport->credentials;
    auto server = LoaderServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A job of 2 ranks x 32 samples (base batches of 16).
  static v1::DataConfig Job(const std::string& name = "jobs/auth") {
    v1::DataConfig c;
    c.set_job(name);
    c.set_dataset(*dir_);
    c.set_num_ranks(2);
    c.set_local_batch_size(32);
    c.set_base_batch_size(16);
    c.set_micro_batches(1);
    c.set_policy("recfleet");
    c.set_cost_model("linear=1");
    return c;
  }

  // The token and the grant the coordinator would give `job`'s ranks.
  static ConnectOptions Connection(const std::string& token,
                                   const v1::DataConfig& job = Job()) {
    ConnectOptions c;
    c.timeout = absl::Seconds(5);
    c.credentials = *MakeChannelCredentials(certs_->Client());
    c.auth_token = token;
    c.data_grant = SignDataGrant(kGrantKey, job);
    return c;
  }

  static std::string* dir_;
  static testing::TestCerts* certs_;
  std::unique_ptr<LoaderServer> server_;
};

std::string* ServerAuthTest::dir_ = nullptr;
testing::TestCerts* ServerAuthTest::certs_ = nullptr;

TEST_F(ServerAuthTest, GetInfoWithoutTheTokenIsUnauthenticated) {
  for (const std::string token : {"", "wrong-token"}) {
    auto client = DataLoaderClient::Connect(server_->address(), Job(), Connection(token));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated)
        << "token '" << token << "': " << client.status();
  }
}

TEST_F(ServerAuthTest, StreamBatchesWithoutTheTokenIsUnauthenticated) {
  auto stub = recfleet::v1::DataLoader::NewStub(
      grpc::CreateChannel(server_->address(), *MakeChannelCredentials(certs_->Client())));
  grpc::ClientContext context;
  recfleet::v1::StreamBatchesRequest request;
  *request.mutable_config() = Job();
  request.set_rank(0);
  auto reader = stub->StreamBatches(&context, request);
  recfleet::v1::RankBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ServerAuthTest, TheTokenOverTlsGetsBatches) {
  auto client = DataLoaderClient::Connect(server_->address(), Job(), Connection(kToken));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->info().num_ranks(), 2);
  auto stream = (*client)->StreamBatches(1, 0, 0, 2);
  ASSERT_TRUE(stream.ok()) << stream.status();
  data::RankBatch batch;
  absl::StatusOr<bool> more = (*stream)->Next(&batch);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_TRUE(*more);
  EXPECT_EQ(batch.samples.num_rows(), 32u);
}

TEST_F(ServerAuthTest, AWorkerOfAnotherJobIsDeniedThisJobsData) {
  // A caller holding the loader token and a valid grant, but for another job.
  const ConnectOptions other_job = Connection(kToken, Job("jobs/other"));
  auto client = DataLoaderClient::Connect(server_->address(), Job(), other_job);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();

  // Straight to StreamBatches, without GetInfo.
  auto stub = recfleet::v1::DataLoader::NewStub(
      grpc::CreateChannel(server_->address(), *MakeChannelCredentials(certs_->Client())));
  for (const std::string& grant : {other_job.data_grant, std::string()}) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    recfleet::v1::StreamBatchesRequest request;
    *request.mutable_config() = Job();
    request.set_data_grant(grant);
    request.set_rank(0);
    auto reader = stub->StreamBatches(&context, request);
    recfleet::v1::RankBatch batch;
    EXPECT_FALSE(reader->Read(&batch)) << "grant '" << grant << "' got a batch";
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "grant '" << grant << "'";
  }
}

TEST_F(ServerAuthTest, AJobsGrantDoesNotOpenAnotherDatasetUnderItsName) {
  // Same job name, another dataset (e.g. another job's files): the grant
  // covers the whole DataConfig, so it no longer matches.
  v1::DataConfig elsewhere = Job();
  elsewhere.set_dataset(*dir_ + "/../elsewhere");
  auto client = DataLoaderClient::Connect(server_->address(), elsewhere, Connection(kToken));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
}

// Guards the server's authentication wrapper: a DataLoader method added to
// the proto but not forwarded by it would answer UNIMPLEMENTED here.
TEST_F(ServerAuthTest, EveryMethodOfTheServiceChecksTheTokenAndTheGrant) {
  const google::protobuf::ServiceDescriptor* service =
      recfleet::v1::GetInfoRequest::descriptor()->file()->FindServiceByName("DataLoader");
  ASSERT_NE(service, nullptr);
  grpc::GenericStub stub(
      grpc::CreateChannel(server_->address(), *MakeChannelCredentials(certs_->Client())));
  // An empty message of any type (no grant), with or without the token.
  auto call = [&](const std::string& method, bool with_token) {
    grpc::ClientContext context;
    if (with_token) context.AddMetadata("authorization", std::string("Bearer ") + kToken);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(s); });
    return done.get_future().get().error_code();
  };
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method = "/" + service->full_name() + "/" + service->method(i)->name();
    EXPECT_EQ(call(method, false), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_EQ(call(method, true), grpc::StatusCode::PERMISSION_DENIED) << method;
  }
}

// Health and reflection, like the coordinator's: no token needed, nothing
// of the data revealed.
TEST(LoaderServerTest, AnswersHealthChecksAndReflection) {
  ServerOptions so;
  so.metrics_port = -1;
  so.auth_token = kToken;
  auto server = LoaderServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string health;
  const std::string service = "recfleet.v1.DataLoader";
  grpc::Status hs = recfleet::testing::GenericCall(
      (*server)->address(), "/grpc.health.v1.Health/Check",
      std::string("\x0a", 1) + static_cast<char>(service.size()) + service, &health);
  ASSERT_TRUE(hs.ok()) << hs.error_message();
  EXPECT_EQ(health, std::string("\x08\x01", 2));  // SERVING
  std::string services;
  grpc::Status rs = recfleet::testing::GenericCall(
      (*server)->address(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      std::string("\x3a\x00", 2), &services);  // list_services
  ASSERT_TRUE(rs.ok()) << rs.error_message();
  EXPECT_NE(services.find(service), std::string::npos);
}

}  // namespace
}  // namespace recfleet::dataloader
