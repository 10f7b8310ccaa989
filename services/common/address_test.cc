#include "services/common/address.h"

#include "gtest/gtest.h"

namespace recfleet {
namespace {

TEST(AddressTest, ParsesHostPort) {
  absl::StatusOr<HostPort> a = ParseHostPort("127.0.0.1:8080", "--x");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  a = ParseHostPort("[::1]:0", "--x");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 0);
  EXPECT_EQ(FormatHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(FormatHostPort("localhost", 5), "localhost:5");
}

TEST(AddressTest, ErrorsNameTheFlagAndForm) {
  for (const char* bad : {"9090", ":9090", "host:", "host:70000", "host:x", "::1:80", "[::1]80"}) {
    absl::StatusOr<HostPort> a = ParseHostPort(bad, "--metrics_address");
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("--metrics_address must be host:port"), std::string::npos)
        << a.status();
    EXPECT_NE(a.status().message().find(bad), std::string::npos) << a.status();
  }
}

}  // namespace
}  // namespace recfleet
