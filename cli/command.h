#ifndef RECFLEET_CLI_COMMAND_H_
#define RECFLEET_CLI_COMMAND_H_

// The `recfleet` command line is a set of subcommands contributed by each
// component (jobs, data, train, plan, ...). A component registers its
// commands from its own library with RECFLEET_REGISTER_COMMAND; cli/BUILD
// links those libraries (alwayslink) into the single `recfleet` binary.
//
// A command receives the words after its name ("recfleet data ingest --x y"
// -> name "data ingest", args {"--x", "y"}) and returns the process exit
// code; it prints its own output. Exit codes follow kExit* below so shell
// users can act on them.

#include <functional>
#include <string>
#include <vector>

namespace recfleet::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // The operation ran and failed.
inline constexpr int kExitUsage = 2;         // Bad flags or arguments.
inline constexpr int kExitUnavailable = 3;   // Server unreachable or timed out.
inline constexpr int kExitNotFound = 4;      // The named job/dataset does not exist.

struct Command {
  std::string name;     // One or more words: "submit", "data ingest".
  std::string summary;  // One line for `recfleet help`.
  std::string usage;    // Full usage text for `recfleet help NAME`.
  std::function<int(const std::vector<std::string>& args)> run;
};

// Adds a command to the process-wide table. Returns true so it can be used
// to initialize a namespace-scope variable.
bool RegisterCommand(Command command);

// All registered commands, sorted by name.
std::vector<const Command*> AllCommands();

// The command named `name` ("data ingest"), or nullptr.
const Command* FindCommand(const std::string& name);

// Runs `command` on `args`, except that `--help` or `-h` anywhere among them
// prints its usage to stdout and returns kExitOk, the same for every command.
int RunCommand(const Command& command, const std::vector<std::string>& args);

}  // namespace recfleet::cli

#define RECFLEET_CLI_CONCAT_INNER(a, b) a##b
#define RECFLEET_CLI_CONCAT(a, b) RECFLEET_CLI_CONCAT_INNER(a, b)
// Usage at namespace scope in a .cc file: RECFLEET_REGISTER_COMMAND({...});
#define RECFLEET_REGISTER_COMMAND(...)                                       \
  static const bool RECFLEET_CLI_CONCAT(recfleet_command_registered_, __LINE__) = \
      ::recfleet::cli::RegisterCommand(::recfleet::cli::Command __VA_ARGS__)

#endif  // RECFLEET_CLI_COMMAND_H_
