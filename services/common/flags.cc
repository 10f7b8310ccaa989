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

ABSL_FLAG(std::string, worker_token_file, "",
          "File holding the workers' bearer token (not the users' token): the coordinator "
          "requires it on every WorkerService call, a worker sends it to the coordinator and "
          "data loaders; empty = use $RECFLEET_WORKER_TOKEN");

namespace recfleet {

absl::StatusOr<std::string> LoadSecret(const std::string& flag, const std::string& file,
                                       const char* env_value) {
  if (file.empty()) return std::string(env_value == nullptr ? "" : env_value);
  std::ifstream in(file);
  if (!in) {
    int err = errno;
    std::string msg = absl::StrCat(flag, " ", file, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(msg) : absl::NotFoundError(msg);
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(buf.str()));
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", file, " is empty; it must hold the secret"));
  }
  return secret;
}

absl::StatusOr<std::string> LoadAuthToken(const std::string& token_file, const char* env_value) {
  return LoadSecret("--auth_token_file", token_file, env_value);
}

absl::StatusOr<std::string> LoadWorkerToken() {
  return LoadSecret("--worker_token_file", absl::GetFlag(FLAGS_worker_token_file),
                    std::getenv("RECFLEET_WORKER_TOKEN"));
}

absl::StatusOr<std::string> LoadAuthToken() {
  return LoadAuthToken(absl::GetFlag(FLAGS_auth_token_file), std::getenv("RECFLEET_AUTH_TOKEN"));
}

}  // namespace recfleet
