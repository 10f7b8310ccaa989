#include "cli/flags.h"

#include <algorithm>
#include <cstdio>

namespace recfleet::cli {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const FlagSpec& spec) {
  Flags f;
  bool only_positional = false;  // After "--".
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (!only_positional && a.size() == 2 && a[0] == '-' && a[1] != '-') {
      auto it = spec.short_names.find(a[1]);
      if (it == spec.short_names.end()) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
      a = "--" + it->second;
    }
    if (only_positional || a.rfind("--", 0) != 0 || a == "--") {
      if (a == "--" && !only_positional) {
        only_positional = true;
        continue;
      }
      if (!spec.positional) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
      f.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const bool known = spec.values.count(name) > 0 || spec.switches.count(name) > 0;
    if (!known && name.find('_') != std::string::npos) {
      std::string kebab = name;
      std::replace(kebab.begin(), kebab.end(), '_', '-');
      if (spec.values.count(kebab) > 0 || spec.switches.count(kebab) > 0) {
        f.deprecations_.push_back(absl::StrCat("--", name, " is deprecated; use --", kebab));
        name = kebab;
      }
    }
    if (spec.switches.count(name) > 0) {
      if (!inline_value) value = "true";
    } else if (spec.values.count(name) > 0) {
      if (!inline_value) {
        if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = args[++i];
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    f.values_[name].push_back(value);
  }
  return f;
}

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const std::set<std::string>& known) {
  FlagSpec spec;
  spec.values = known;
  return Parse(args, spec);
}

std::string Flags::Str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second.back();
}

bool Flags::Bool(const std::string& name) const {
  const std::string v = Str(name, "false");
  return v == "true" || v == "yes" || v == "1";
}

std::vector<std::string> Flags::All(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>() : it->second;
}

absl::StatusOr<Flags> ParseCommandFlags(const std::string& command, const std::vector<std::string>& args,
                                        const FlagSpec& spec) {
  absl::StatusOr<Flags> f = Flags::Parse(args, spec);
  if (!f.ok()) {
    std::fprintf(stderr, "recfleet %s: %s; see `recfleet help %s`\n", command.c_str(),
                 std::string(f.status().message()).c_str(), command.c_str());
    return f;
  }
  for (const std::string& d : f->deprecations()) {
    std::fprintf(stderr, "recfleet %s: warning: %s\n", command.c_str(), d.c_str());
  }
  return f;
}

absl::StatusOr<Flags> ParseCommandFlags(const std::string& command, const std::vector<std::string>& args,
                                        const std::set<std::string>& values) {
  FlagSpec spec;
  spec.values = values;
  return ParseCommandFlags(command, args, spec);
}

}  // namespace recfleet::cli
