#include "services/common/flags.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(LoadAuthTokenTest, FileWinsOverEnvironmentAndIsTrimmed) {
  std::string path = TempPath("token");
  std::ofstream(path) << "  s3cret\n";
  absl::StatusOr<std::string> t = LoadAuthToken(path, "from-env");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret");
}

TEST(LoadAuthTokenTest, EnvironmentWhenNoFile) {
  EXPECT_EQ(LoadAuthToken("", "from-env").value(), "from-env");
  EXPECT_EQ(LoadAuthToken("", nullptr).value(), "");
}

TEST(LoadAuthTokenTest, MissingOrEmptyFileIsAnErrorNamingIt) {
  absl::StatusOr<std::string> t = LoadAuthToken(TempPath("absent"), nullptr);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("absent"), std::string::npos);
  std::string empty = TempPath("empty");
  std::ofstream(empty) << "\n";
  t = LoadAuthToken(empty, nullptr);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet
