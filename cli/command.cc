#include "cli/command.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

namespace recfleet::cli {
namespace {

std::map<std::string, std::unique_ptr<Command>>& Table() {
  static auto* table = new std::map<std::string, std::unique_ptr<Command>>();
  return *table;
}

}  // namespace

bool RegisterCommand(Command command) {
  std::string name = command.name;
  Table()[name] = std::make_unique<Command>(std::move(command));
  return true;
}

std::vector<const Command*> AllCommands() {
  std::vector<const Command*> out;
  for (const auto& [name, cmd] : Table()) out.push_back(cmd.get());
  return out;
}

const Command* FindCommand(const std::string& name) {
  for (const Command* c : AllCommands()) {
    if (c->name == name) return c;
  }
  return nullptr;
}

int RunCommand(const Command& command, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::printf("%s\n", command.usage.c_str());
      return kExitOk;
    }
  }
  return command.run(args);
}

}  // namespace recfleet::cli
