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

// Lists the commands whose name starts with `group` and a space ("data"),
// or every command when `group` is empty.
void PrintHelp(std::FILE* out, const std::string& group = "") {
  const std::string prefix = group.empty() ? "" : group + " ";
  std::fprintf(out, "usage: recfleet %sCOMMAND [ARGS...]\n\ncommands:\n", prefix.c_str());
  for (const Command* c : AllCommands()) {
    if (!group.empty() && c->name.rfind(group + " ", 0) != 0) continue;
    std::fprintf(out, "  %-22s %s\n", c->name.c_str(), c->summary.c_str());
  }
  std::fprintf(out, "\n`recfleet help COMMAND` shows a command's flags.\n");
}

// Whether `word` names a group of commands ("data" of "data ingest", ...).
bool IsGroup(const std::string& word) {
  for (const Command* c : AllCommands()) {
    if (c->name.rfind(word + " ", 0) == 0) return true;
  }
  return false;
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
    PrintHelp(stdout);
    return words.empty() ? recfleet::cli::kExitUsage : recfleet::cli::kExitOk;
  }
  if (words[0] == "help") {
    std::vector<std::string> rest(words.begin() + 1, words.end());
    size_t used = 0;
    const Command* c = rest.empty() ? nullptr : Match(rest, &used);
    if (c == nullptr) {
      const bool group = rest.size() == 1 && IsGroup(rest[0]);
      PrintHelp(stdout, group ? rest[0] : "");
      return rest.empty() || group ? recfleet::cli::kExitOk : recfleet::cli::kExitUsage;
    }
    std::printf("%s\n", c->usage.c_str());
    return recfleet::cli::kExitOk;
  }
  size_t used = 0;
  const Command* c = Match(words, &used);
  if (c == nullptr && IsGroup(words[0])) {
    // `recfleet data [--help]`: the group's commands.
    const bool help = words.size() == 2 && (words[1] == "--help" || words[1] == "-h");
    if (words.size() > 1 && !help) {
      std::fprintf(stderr, "recfleet: unknown command '%s %s'\n", words[0].c_str(), words[1].c_str());
    }
    PrintHelp(help ? stdout : stderr, words[0]);
    return help ? recfleet::cli::kExitOk : recfleet::cli::kExitUsage;
  }
  if (c == nullptr) {
    std::fprintf(stderr, "recfleet: unknown command '%s'; run `recfleet help` for the list\n",
                 words[0].c_str());
    return recfleet::cli::kExitUsage;
  }
  std::vector<std::string> args(words.begin() + used, words.end());
  return recfleet::cli::RunCommand(*c, args);
}
