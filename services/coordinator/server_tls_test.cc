// The coordinator's gRPC port over TLS on 127.0.0.1: a client must trust its
// CA, and under mutual TLS present a certificate the cluster's CA signed.

#include <memory>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recfleet/v1/job_service.grpc.pb.h"
#include "services/common/tls.h"
#include "services/common/tls_testing.h"
#include "services/coordinator/server.h"

namespace recfleet::coordinator {
namespace {

class ServerTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = testing::MakeTestCerts("cluster");
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto other = testing::MakeTestCerts("other");
    ASSERT_TRUE(other.ok()) << other.status();
    cluster_ = new testing::TestCerts(*cluster);
    other_ = new testing::TestCerts(*other);
  }

  std::unique_ptr<CoordinatorServer> Start(bool mutual) {
    absl::StatusOr<ServerTransport> transport =
        MakeServerTransport(cluster_->Server(mutual), "127.0.0.1");
    EXPECT_TRUE(transport.ok()) << transport.status();
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.credentials = transport->credentials;
    auto server = CoordinatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // ListJobs through a channel made from `tls`.
  static grpc::Status List(const std::string& address, const TlsOptions& tls) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    auto stub = ::recfleet::v1::JobService::NewStub(grpc::CreateChannel(address, *credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ::recfleet::v1::ListJobsResponse response;
    return stub->ListJobs(&context, ::recfleet::v1::ListJobsRequest(), &response);
  }

  static testing::TestCerts* cluster_;
  static testing::TestCerts* other_;
};

testing::TestCerts* ServerTlsTest::cluster_ = nullptr;
testing::TestCerts* ServerTlsTest::other_ = nullptr;

TEST_F(ServerTlsTest, ClientTrustingTheClusterCaIsServed) {
  std::unique_ptr<CoordinatorServer> server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  grpc::Status status = List(server->address(), cluster_->Client());
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
}

TEST_F(ServerTlsTest, PlainTextClientIsRefused) {
  std::unique_ptr<CoordinatorServer> server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(List(server->address(), TlsOptions()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServerTlsTest, ClientTrustingAnotherCaRefusesTheServer) {
  std::unique_ptr<CoordinatorServer> server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(List(server->address(), other_->Client()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServerTlsTest, MutualTlsNeedsAClientCertificateOfTheCluster) {
  std::unique_ptr<CoordinatorServer> server = Start(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(List(server->address(), cluster_->Client(/*with_client_cert=*/false)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A certificate of another CA, while trusting the server's: refused.
  TlsOptions foreign = other_->Client(/*with_client_cert=*/true);
  foreign.ca_file = cluster_->ca();
  EXPECT_EQ(List(server->address(), foreign).error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::Status status = List(server->address(), cluster_->Client(/*with_client_cert=*/true));
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
}

}  // namespace
}  // namespace recfleet::coordinator
