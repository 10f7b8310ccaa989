#include "services/common/log.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace recfleet {
namespace {

// 2026-12-01T20:21:07.123456Z, as a POSIX regex (gtest's: no \\d).
constexpr char kStamp[] = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z";

TEST(LogTest, LinesCarryUtcTimeLevelAndName) {
  InitLogging("recfleet-test");
  testing::internal::CaptureStderr();
  spdlog::info("serving on {} with {} workers", "127.0.0.1:1", 2);
  spdlog::warn("lease of {} expired", "w-1");
  spdlog::debug("not shown at the default level");
  const std::string out = testing::internal::GetCapturedStderr();
  const std::string expected = std::string(kStamp) +
                               " I recfleet-test: serving on 127.0.0.1:1 with 2 workers\n" +
                               kStamp + " W recfleet-test: lease of w-1 expired\n";
  EXPECT_TRUE(testing::internal::RE::FullMatch(out, expected)) << out;
}

TEST(LogTest, EnvironmentSetsTheLevel) {
  ::setenv("SPDLOG_LEVEL", "debug", 1);
  InitLogging("recfleet-test");
  ::unsetenv("SPDLOG_LEVEL");
  testing::internal::CaptureStderr();
  spdlog::debug("now shown");
  spdlog::trace("still not");
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find(" D recfleet-test: now shown\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("still not"), std::string::npos) << out;
}

}  // namespace
}  // namespace recfleet
