#ifndef RECFLEET_WORKER_COMM_GRPC_KV_STORE_H_
#define RECFLEET_WORKER_COMM_GRPC_KV_STORE_H_

// The rendezvous store of a real job: a client of the coordinator's
// WorkerService KvSet / KvGet / KvWait. The coordinator keeps one namespace
// per (job, restart_epoch) and rejects calls of a stale epoch with
// FAILED_PRECONDITION, so a slow rank of an earlier attempt can never read
// or overwrite keys of the current one. Thread-safe.

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "recfleet/v1/worker_service.grpc.pb.h"
#include "worker/comm/kv_store.h"

namespace recfleet {
namespace comm {

class GrpcKvStore : public KvStore {
 public:
  // `job` is the job's resource name ("jobs/{id}"); `restart_epoch` the epoch
  // of the worker's assignment. Set and Get give up after `rpc_timeout`.
  // A non-empty `auth_token` is sent as "authorization: Bearer <token>" on
  // every call: the workers' token (the coordinator's --worker_token_file).
  GrpcKvStore(std::shared_ptr<v1::WorkerService::StubInterface> stub, std::string job, int64_t restart_epoch,
              absl::Duration rpc_timeout = absl::Seconds(10), std::string auth_token = "");

  // Who calls: the coordinator serves rendezvous calls only to a registered
  // worker presenting its credential, and only for the job and epoch it is
  // assigned. Asked before every call (the credential changes when the
  // worker registers again). Unset: calls carry no identity.
  struct Identity {
    std::string worker_id;
    std::string worker_credential;
  };
  void set_identity(std::function<Identity()> identity) { identity_ = std::move(identity); }

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  // The server caps one KvWait at 300 s; longer waits are split into
  // several calls.
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;
  std::string job_;
  int64_t restart_epoch_;
  // Sets the call's deadline and credentials.
  void Prepare(grpc::ClientContext& context, absl::Duration deadline) const;
  // Puts the worker identity into a request.
  template <typename Request>
  void Identify(Request& request) const {
    if (!identity_) return;
    Identity id = identity_();
    request.set_worker_id(std::move(id.worker_id));
    request.set_worker_credential(std::move(id.worker_credential));
  }

  std::function<Identity()> identity_;
  absl::Duration rpc_timeout_;
  std::string auth_token_;
};

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_GRPC_KV_STORE_H_
