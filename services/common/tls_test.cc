#include "services/common/tls.h"

#include <fstream>

#include "gtest/gtest.h"
#include "services/common/tls_testing.h"

namespace recfleet {
namespace {

TEST(TlsTest, LoopbackHostsAreOnlyLocalOnes) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("recfleet-coordinator"));
  EXPECT_FALSE(IsLoopbackHost(""));
}

TEST(TlsTest, PlainTextOnLoopbackIsAllowedAndSaysSo) {
  absl::StatusOr<ServerTransport> t = MakeServerTransport(TlsOptions(), "127.0.0.1");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->tls);
  EXPECT_NE(t->credentials, nullptr);
  EXPECT_NE(t->description.find("plain text"), std::string::npos) << t->description;
}

TEST(TlsTest, PlainTextOnOtherAddressesNeedsTheExplicitFlag) {
  absl::StatusOr<ServerTransport> refused = MakeServerTransport(TlsOptions(), "0.0.0.0");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--insecure_plaintext"), std::string::npos);
  TlsOptions insecure;
  insecure.insecure_plaintext = true;
  absl::StatusOr<ServerTransport> allowed = MakeServerTransport(insecure, "0.0.0.0");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_FALSE(allowed->tls);
  EXPECT_NE(allowed->description.find("WARNING"), std::string::npos);
}

TEST(TlsTest, IncompleteOrUnreadableFilesAreRejected) {
  TlsOptions cert_only;
  cert_only.cert_file = "server.pem";
  EXPECT_EQ(MakeServerTransport(cert_only, "127.0.0.1").status().code(),
            absl::StatusCode::kInvalidArgument);
  TlsOptions client_ca_only;
  client_ca_only.client_ca_file = "ca.pem";
  EXPECT_EQ(MakeServerTransport(client_ca_only, "127.0.0.1").status().code(),
            absl::StatusCode::kInvalidArgument);
  TlsOptions missing;
  missing.cert_file = "/nonexistent/server.pem";
  missing.key_file = "/nonexistent/server.key";
  absl::StatusOr<ServerTransport> t = MakeServerTransport(missing, "127.0.0.1");
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("--tls_cert /nonexistent/server.pem"), std::string::npos);

  const std::string not_pem = std::string(getenv("TEST_TMPDIR")) + "/not.pem";
  std::ofstream(not_pem) << "hello\n";
  TlsOptions bad_ca;
  bad_ca.ca_file = not_pem;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c = MakeChannelCredentials(bad_ca);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("not a PEM file"), std::string::npos);
  TlsOptions client_cert_without_ca;
  client_cert_without_ca.cert_file = "client.pem";
  client_cert_without_ca.key_file = "client.key";
  EXPECT_EQ(MakeChannelCredentials(client_cert_without_ca).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TlsTest, CertificatesOfTheTestClusterMakeTlsCredentials) {
  absl::StatusOr<testing::TestCerts> certs = testing::MakeTestCerts("tls_test");
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<ServerTransport> server = MakeServerTransport(certs->Server(true), "0.0.0.0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(server->tls);
  EXPECT_NE(server->description.find("mutual TLS"), std::string::npos);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> client =
      MakeChannelCredentials(certs->Client(true));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE(*client, nullptr);
}

}  // namespace
}  // namespace recfleet
