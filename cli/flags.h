#ifndef RECFLEET_CLI_FLAGS_H_
#define RECFLEET_CLI_FLAGS_H_

// Flags of one `recfleet` subcommand: "--name value" or "--name=value"
// pairs, checked against the names the command knows. Parse errors and bad
// numbers come back as InvalidArgument naming the flag.

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

class Flags {
 public:
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::set<std::string>& known);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The flag's value, or `def` when it was not given.
  std::string Str(const std::string& name, const std::string& def = "") const;
  // Parses the flag into `*out` when given (integer or floating point);
  // leaves `*out` unchanged when it was not given or does not parse.
  template <typename T>
  absl::Status Get(const std::string& name, T* out) const {
    auto it = values_.find(name);
    if (it == values_.end()) return absl::OkStatus();
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      double v;
      ok = absl::SimpleAtod(it->second, &v);
      if (ok) *out = static_cast<T>(v);
    } else {
      T v;
      ok = absl::SimpleAtoi(it->second, &v);
      if (ok) *out = v;
    }
    return ok ? absl::OkStatus()
              : absl::InvalidArgumentError(
                    absl::StrCat("--", name, ": '", it->second, "' is not a number"));
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_FLAGS_H_
