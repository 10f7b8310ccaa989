// Loops over every command linked into the `recfleet` binary: `--help` and
// `-h` exit 0 and print the command's usage, which names the command and
// spells every flag in kebab-case (one style across the CLI).

#include <regex>
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
      std::smatch snake;
      EXPECT_FALSE(std::regex_search(out, snake, std::regex("--[a-z0-9]+_[a-z0-9_]*")))
          << c->name << ": usage names " << snake.str() << "; CLI flags are --kebab-case";
    }
  }
}

}  // namespace
}  // namespace recfleet::cli
