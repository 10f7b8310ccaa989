// recfleet: the command line for jobs, data, training and planning.
// Dispatches to the longest registered command name matching the leading
// words of argv (see cli/command.h).

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/command.h"

namespace {

using recfleet::cli::AllCommands;
using recfleet::cli::Command;

void PrintHelp() {
  std::printf("usage: recfleet COMMAND [ARGS...]\n\ncommands:\n");
  for (const Command* c : AllCommands()) {
    std::printf("  %-22s %s\n", c->name.c_str(), c->summary.c_str());
  }
  std::printf("\n`recfleet help COMMAND` shows a command's flags.\n");
}

// Finds the command whose (multi-word) name matches the most leading words.
const Command* Match(const std::vector<std::string>& words, size_t* used) {
  const Command* best = nullptr;
  *used = 0;
  for (const Command* c : AllCommands()) {
    for (size_t n = 1; n <= words.size(); ++n) {
      std::vector<std::string> head(words.begin(), words.begin() + n);
      if (absl::StrJoin(head, " ") == c->name && n > *used) {
        best = c;
        *used = n;
      }
    }
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty() || words[0] == "--help" || words[0] == "-h") {
    PrintHelp();
    return words.empty() ? recfleet::cli::kExitUsage : recfleet::cli::kExitOk;
  }
  if (words[0] == "help") {
    std::vector<std::string> rest(words.begin() + 1, words.end());
    size_t used = 0;
    const Command* c = rest.empty() ? nullptr : Match(rest, &used);
    if (c == nullptr) {
      PrintHelp();
      return rest.empty() ? recfleet::cli::kExitOk : recfleet::cli::kExitUsage;
    }
    std::printf("%s\n", c->usage.c_str());
    return recfleet::cli::kExitOk;
  }
  size_t used = 0;
  const Command* c = Match(words, &used);
  if (c == nullptr) {
    std::fprintf(stderr, "recfleet: unknown command '%s'; run `recfleet help` for the list\n",
                 words[0].c_str());
    return recfleet::cli::kExitUsage;
  }
  std::vector<std::string> args(words.begin() + used, words.end());
  return recfleet::cli::RunCommand(*c, args);
}
