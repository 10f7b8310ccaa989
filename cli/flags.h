#ifndef RECFLEET_CLI_FLAGS_H_
#define RECFLEET_CLI_FLAGS_H_

// The one flag parser of every `recfleet` subcommand, so they all read the
// same: `--kebab-case` names, "--name value" or "--name=value", switches
// ("--watch", or "--watch=true|false"), flags that may repeat (All), one-letter
// short forms ("-o json" for "--output json") and positional words.
//
// Names are kebab-case. The snake_case spelling of a known flag
// ("--auth_token_file") is still accepted and recorded in deprecations(),
// which ParseCommandFlags prints as a warning, so existing scripts keep
// working while they move to one style.
//
// Parse errors and bad numbers come back as InvalidArgument naming the flag.

#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recfleet::cli {

// What a command accepts. Every name is kebab-case, without dashes.
struct FlagSpec {
  std::set<std::string> values;    // --name VALUE
  std::set<std::string> switches;  // --name, --name=true|false
  std::map<char, std::string> short_names;  // 'o' -> "output": "-o VALUE"
  bool positional = false;         // words that are not flags are allowed
};

class Flags {
 public:
  // Parses `args` against `spec`.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args, const FlagSpec& spec);
  // Value flags only, no positional words.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::set<std::string>& known);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The flag's (last) value, or `def` when it was not given. A switch given
  // is "true" (or what followed "=").
  std::string Str(const std::string& name, const std::string& def = "") const;
  // A switch: given without a value or as true/yes/1.
  bool Bool(const std::string& name) const;
  // Every value of a repeated flag, in order.
  std::vector<std::string> All(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // "--old_name is deprecated; use --old-name" for each snake_case flag given.
  const std::vector<std::string>& deprecations() const { return deprecations_; }

  // Parses the flag into `*out` when given (integer or floating point);
  // leaves `*out` unchanged when it was not given or does not parse.
  template <typename T>
  absl::Status Get(const std::string& name, T* out) const {
    auto it = values_.find(name);
    if (it == values_.end()) return absl::OkStatus();
    const std::string& text = it->second.back();
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      double v;
      ok = absl::SimpleAtod(text, &v);
      if (ok) *out = static_cast<T>(v);
    } else {
      T v;
      ok = absl::SimpleAtoi(text, &v);
      if (ok) *out = v;
    }
    return ok ? absl::OkStatus()
              : absl::InvalidArgumentError(absl::StrCat("--", name, ": '", text, "' is not a number"));
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  std::vector<std::string> deprecations_;
};

// Flags::Parse for command `command` ("data ingest"): prints each
// deprecation to stderr as "recfleet COMMAND: warning: ...", and a parse
// error as "recfleet COMMAND: ERROR; see `recfleet help COMMAND`".
absl::StatusOr<Flags> ParseCommandFlags(const std::string& command, const std::vector<std::string>& args,
                                        const FlagSpec& spec);
// The same for value flags only, no positional words.
absl::StatusOr<Flags> ParseCommandFlags(const std::string& command, const std::vector<std::string>& args,
                                        const std::set<std::string>& values);

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_FLAGS_H_
