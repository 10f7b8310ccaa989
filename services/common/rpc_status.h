#ifndef RECFLEET_SERVICES_COMMON_RPC_STATUS_H_
#define RECFLEET_SERVICES_COMMON_RPC_STATUS_H_

// absl::Status <-> grpc::Status. Both use the canonical codes with the same
// numbers, so the code and message cross the wire unchanged.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace recfleet {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_RPC_STATUS_H_
