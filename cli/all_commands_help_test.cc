// Loops over every command linked into the `recfleet` binary: `--help` and
// `-h` exit 0 and print the command's usage, which names the command.

#include <string>

#include "cli/command.h"
#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

TEST(AllCommandsHelpTest, EveryCommandPrintsItsUsage) {
  const std::vector<const Command*> commands = AllCommands();
  ASSERT_GE(commands.size(), 10u);
  for (const Command* c : commands) {
    for (const char* flag : {"--help", "-h"}) {
      testing::internal::CaptureStdout();
      EXPECT_EQ(RunCommand(*c, {flag}), kExitOk) << c->name;
      const std::string out = testing::internal::GetCapturedStdout();
      EXPECT_NE(out.find("recfleet " + c->name), std::string::npos) << c->name << ": " << out;
    }
  }
}

}  // namespace
}  // namespace recfleet::cli
