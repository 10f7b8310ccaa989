#ifndef RECFLEET_SERVICES_COMMON_BEARER_AUTH_H_
#define RECFLEET_SERVICES_COMMON_BEARER_AUTH_H_

// Optional shared-secret authentication for recfleet's gRPC APIs: when a
// server is given a token, every call must carry the metadata
// "authorization: Bearer <token>". Meant for a trusted network behind TLS
// termination or on loopback, not as a user identity system.
//
// Thread-safe: immutable after construction.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace recfleet {

class BearerAuth {
 public:
  // An empty token disables the check (every call is allowed).
  explicit BearerAuth(std::string token) : token_(std::move(token)) {}

  bool enabled() const { return !token_.empty(); }

  // OK, or UNAUTHENTICATED saying what is missing or wrong (never echoing
  // the expected token).
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::string token_;
};

// Adds "authorization: Bearer <token>" to a client call; no-op when empty.
void AttachBearerToken(const std::string& token, grpc::ClientContext* context);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_BEARER_AUTH_H_
