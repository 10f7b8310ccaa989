#include <string>

#include "cli/command.h"
#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

TEST(VersionCommandTest, PrintsTheReleaseAndTheLibrariesItRunsWith) {
  const Command* c = FindCommand("version");
  ASSERT_NE(c, nullptr);
  testing::internal::CaptureStdout();
  EXPECT_EQ(c->run({}), kExitOk);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.rfind("recfleet 0.1.0\n", 0), 0u) << out;
  EXPECT_NE(out.find("C++ 201703"), std::string::npos) << out;
  // The versions setup.sh pins (tools/setup.sh).
  EXPECT_NE(out.find("gRPC 1.51.1"), std::string::npos) << out;
  EXPECT_NE(out.find("protobuf 3.21.12"), std::string::npos) << out;
  EXPECT_NE(out.find("abseil LTS 20220623"), std::string::npos) << out;
}

TEST(VersionCommandTest, TakesNoArguments) {
  const Command* c = FindCommand("version");
  ASSERT_NE(c, nullptr);
  testing::internal::CaptureStderr();
  EXPECT_EQ(c->run({"extra"}), kExitUsage);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("takes no arguments"), std::string::npos);
}

}  // namespace
}  // namespace recfleet::cli
