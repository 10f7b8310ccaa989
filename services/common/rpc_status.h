#ifndef RECFLEET_SERVICES_COMMON_RPC_STATUS_H_
#define RECFLEET_SERVICES_COMMON_RPC_STATUS_H_

// absl::Status <-> grpc::Status. Both use the canonical codes with the same
// numbers, so the code and message cross the wire unchanged; an
// absl::Status's payloads travel as the google.rpc.Status details (Any, type
// URL = payload URL) in grpc-status-details-bin, which every gRPC client can
// read, and come back as payloads.
//
// The one detail recfleet sends today is google.rpc.BadRequest: one field
// violation per problem with a request (a JobSpec's field path and what is
// wrong), so clients list problems without parsing the message.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace recfleet {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

inline constexpr char kBadRequestTypeUrl[] = "type.googleapis.com/google.rpc.BadRequest";

// A field path and what is wrong with it ("spec.model.tables[2].dim",
// "must be > 0, got 0").
using FieldViolation = std::pair<std::string, std::string>;

// INVALID_ARGUMENT with `message` and a google.rpc.BadRequest of
// `violations` attached.
absl::Status BadRequestError(absl::string_view message,
                             const std::vector<FieldViolation>& violations);

// The violations of a status's BadRequest detail; empty when it has none.
std::vector<FieldViolation> FieldViolationsOf(const absl::Status& status);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_RPC_STATUS_H_
