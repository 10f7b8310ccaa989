#ifndef RECFLEET_CLI_JOBS_SPEC_FILE_H_
#define RECFLEET_CLI_JOBS_SPEC_FILE_H_

// Reads a JobSpec from a YAML or JSON file (what `recfleet submit` takes).
// Field names are the proto's (snake_case; lowerCamel also accepted), enums
// by name. Errors name the file, the field path and the line:
//   job.yaml:12: spec.model.tables[1].dim: expected an integer, got "wide"

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::cli {

// By extension: .yaml / .yml -> YAML, .json -> JSON; otherwise by content
// (a leading '{' means JSON). Errors: NOT_FOUND (no file), INVALID_ARGUMENT.
absl::StatusOr<::recfleet::v1::JobSpec> LoadJobSpec(const std::string& path);

// YAML text onto any message; `file` and `root` only label errors.
absl::Status YamlToMessage(const std::string& yaml, const std::string& file,
                           const std::string& root, google::protobuf::Message* message);

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_JOBS_SPEC_FILE_H_
