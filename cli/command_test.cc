#include "cli/command.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

TEST(CommandTest, HelpAnywherePrintsUsageForEveryCommand) {
  int runs = 0;
  const Command c{"demo thing", "a demo", "usage: recfleet demo thing --x X",
                  [&](const std::vector<std::string>&) {
                    ++runs;
                    return kExitUsage;
                  }};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--help"}, {"-h"}, {"--x", "1", "--help"}}) {
    testing::internal::CaptureStdout();
    EXPECT_EQ(RunCommand(c, args), kExitOk);
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "usage: recfleet demo thing --x X\n");
  }
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(RunCommand(c, {"--x", "1"}), kExitUsage);
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace recfleet::cli
