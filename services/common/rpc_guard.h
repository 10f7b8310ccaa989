#ifndef RECFLEET_SERVICES_COMMON_RPC_GUARD_H_
#define RECFLEET_SERVICES_COMMON_RPC_GUARD_H_

// What every recfleet RPC handler does around its domain call: check the
// bearer token, time the call, record its latency and status code, and turn
// absl::Status into grpc::Status. Keeps the gRPC adapters one line per method.
//
// Thread-safe; the auth and metrics objects must outlive the guard.

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "services/common/bearer_auth.h"
#include "services/common/rpc_metrics.h"

namespace recfleet {

class RpcGuard {
 public:
  RpcGuard(const BearerAuth* auth, RpcMetrics* metrics) : auth_(auth), metrics_(metrics) {}

  // Synchronous handlers: authorize, run `handler`, record, convert.
  // `method` must be a string literal.
  grpc::Status Run(const grpc::ServerContextBase& context, const char* method,
                   const std::function<absl::Status()>& handler) const;

  // Asynchronous handlers split the same steps: Authorize at the start,
  // Record when the call completes.
  absl::Status Authorize(const grpc::ServerContextBase& context) const {
    return auth_->Check(context);
  }
  void Record(const char* method, absl::StatusCode code, absl::Time start) const {
    metrics_->Observe(method, code, absl::Now() - start);
  }

 private:
  const BearerAuth* auth_;
  RpcMetrics* metrics_;
};

// Moves a domain call's value into the RPC response; returns its status.
template <typename T>
absl::Status FillResponse(absl::StatusOr<T> result, T* response) {
  if (result.ok()) *response = *std::move(result);
  return result.status();
}

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_RPC_GUARD_H_
