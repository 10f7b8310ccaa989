#include "services/common/flags.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, metrics_address, "",
          "host:port for the Prometheus /metrics and /healthz HTTP endpoint; empty = none, "
          "port 0 = the OS picks");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token every RPC must carry; empty = use $RECFLEET_AUTH_TOKEN; "
          "neither = no authentication");

namespace recfleet {

absl::StatusOr<std::string> LoadAuthToken(const std::string& token_file, const char* env_value) {
  if (token_file.empty()) return std::string(env_value == nullptr ? "" : env_value);
  std::ifstream in(token_file);
  if (!in) {
    int err = errno;
    std::string msg = absl::StrCat("--auth_token_file ", token_file, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(msg) : absl::NotFoundError(msg);
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buf.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file ", token_file, " is empty; it must hold the token"));
  }
  return token;
}

absl::StatusOr<std::string> LoadAuthToken() {
  return LoadAuthToken(absl::GetFlag(FLAGS_auth_token_file), std::getenv("RECFLEET_AUTH_TOKEN"));
}

}  // namespace recfleet
