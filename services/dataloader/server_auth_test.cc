// A data loader started with a bearer token (and TLS) serves only callers
// that present the token: training batches are not for anyone who connects.

#include <future>
#include <memory>
#include <string>

#include "data/loader.h"
#include "data/synth.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/tls.h"
#include "services/common/tls_testing.h"
#include "services/dataloader/client.h"
#include "services/dataloader/server.h"

namespace recfleet::dataloader {
namespace {

constexpr char kToken[] = "loader-test-token";

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
    absl::StatusOr<ServerTransport> transport = MakeServerTransport(certs_->Server(), so.host);
    ASSERT_TRUE(transport.ok()) << transport.status();
    so.credentials = transport->credentials;
    auto server = LoaderServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  static ConnectOptions Connection(const std::string& token) {
    ConnectOptions c;
    c.timeout = absl::Seconds(5);
    c.credentials = *MakeChannelCredentials(certs_->Client());
    c.auth_token = token;
    return c;
  }

  // A job of 2 ranks x 32 samples (base batches of 16).
  static v1::DataConfig Job() {
    v1::DataConfig c;
    c.set_job("jobs/auth");
    c.set_dataset(*dir_);
    c.set_num_ranks(2);
    c.set_local_batch_size(32);
    c.set_base_batch_size(16);
    c.set_micro_batches(1);
    c.set_policy("recfleet");
    c.set_cost_model("linear=1");
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

// Guards the server's authentication wrapper: a DataLoader method added to
// the proto but not forwarded by it would answer UNIMPLEMENTED here.
TEST_F(ServerAuthTest, EveryMethodOfTheServiceChecksTheToken) {
  const google::protobuf::ServiceDescriptor* service =
      recfleet::v1::GetInfoRequest::descriptor()->file()->FindServiceByName("DataLoader");
  ASSERT_NE(service, nullptr);
  grpc::GenericStub stub(
      grpc::CreateChannel(server_->address(), *MakeChannelCredentials(certs_->Client())));
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method =
        "/" + service->full_name() + "/" + service->method(i)->name();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("");  // An empty message of any type.
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(s); });
    EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
  }
}

}  // namespace
}  // namespace recfleet::dataloader
