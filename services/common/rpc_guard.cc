#include "services/common/rpc_guard.h"

#include "services/common/rpc_status.h"

namespace recfleet {

grpc::Status RpcGuard::Run(const grpc::ServerContextBase& context, const char* method,
                           const std::function<absl::Status()>& handler) const {
  const absl::Time start = absl::Now();
  absl::Status status = auth_->Check(context);
  if (status.ok()) status = handler();
  Record(method, status.code(), start);
  return ToGrpcStatus(status);
}

}  // namespace recfleet
