#ifndef RECFLEET_SERVICES_COMMON_FLAGS_H_
#define RECFLEET_SERVICES_COMMON_FLAGS_H_

// Flags every recfleet server takes, defined once so they read the same in
// the coordinator, data-loader and worker:
//   --metrics_address  host:port of the /metrics + /healthz HTTP endpoint
//                      (empty = none; port 0 = the OS picks)
//   --auth_token_file  file holding the bearer token clients must present;
//                      the environment variable RECFLEET_AUTH_TOKEN is used
//                      when the flag is empty. No token = no auth.
//   --worker_token_file  file holding the workers' bearer token (coordinator:
//                      what WorkerService calls must carry; worker: what it
//                      sends to the coordinator and data loaders);
//                      $RECFLEET_WORKER_TOKEN when the flag is empty. Users
//                      never hold it, workers never hold the users' token.

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

ABSL_DECLARE_FLAG(std::string, metrics_address);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, worker_token_file);

namespace recfleet {

// The bearer token from --auth_token_file (trailing whitespace stripped) or
// $RECFLEET_AUTH_TOKEN; "" when neither is set. Errors: NOT_FOUND /
// PERMISSION_DENIED naming the file, INVALID_ARGUMENT if the file is empty.
absl::StatusOr<std::string> LoadAuthToken();

// The same, from explicit inputs (testable without flags or environment).
absl::StatusOr<std::string> LoadAuthToken(const std::string& token_file, const char* env_value);

// The workers' token from --worker_token_file or $RECFLEET_WORKER_TOKEN,
// with LoadAuthToken's rules and errors.
absl::StatusOr<std::string> LoadWorkerToken();

// A secret from `file` (trailing whitespace stripped) or, when `file` is
// empty, `env_value` (may be null); "" when neither is set. `flag` names
// the file in errors. Errors as LoadAuthToken's.
absl::StatusOr<std::string> LoadSecret(const std::string& flag, const std::string& file,
                                       const char* env_value);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_FLAGS_H_
