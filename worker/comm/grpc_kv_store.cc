#include "worker/comm/grpc_kv_store.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/bearer_auth.h"

namespace recfleet {
namespace comm {
namespace {

// The server's bound on one KvWait (worker_service.proto).
constexpr absl::Duration kMaxServerWait = absl::Seconds(300);
// Time for the reply to travel after the server gave up waiting.
constexpr absl::Duration kReplySlack = absl::Seconds(5);

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("rendezvous ", what, ": ", s.error_message()));
}

}  // namespace

GrpcKvStore::GrpcKvStore(std::shared_ptr<v1::WorkerService::StubInterface> stub, std::string job,
                         int64_t restart_epoch, absl::Duration rpc_timeout, std::string auth_token)
    : stub_(std::move(stub)),
      job_(std::move(job)),
      restart_epoch_(restart_epoch),
      rpc_timeout_(rpc_timeout),
      auth_token_(std::move(auth_token)) {}

void GrpcKvStore::Prepare(grpc::ClientContext& context, absl::Duration deadline) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  AttachBearerToken(auth_token_, &context);
}

absl::Status GrpcKvStore::Set(absl::string_view key, absl::string_view value) {
  v1::KvSetRequest request;
  request.set_job(job_);
  request.set_restart_epoch(restart_epoch_);
  Identify(request);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::KvSetResponse response;
  grpc::ClientContext context;
  Prepare(context, rpc_timeout_);
  return FromGrpc(stub_->KvSet(&context, request, &response), absl::StrCat("KvSet '", key, "'"));
}

absl::StatusOr<std::string> GrpcKvStore::Get(absl::string_view key) {
  v1::KvGetRequest request;
  request.set_job(job_);
  request.set_restart_epoch(restart_epoch_);
  Identify(request);
  request.set_key(std::string(key));
  v1::KvGetResponse response;
  grpc::ClientContext context;
  Prepare(context, rpc_timeout_);
  absl::Status s = FromGrpc(stub_->KvGet(&context, request, &response), absl::StrCat("KvGet '", key, "'"));
  if (!s.ok()) return s;
  return std::move(*response.mutable_value());
}

absl::Status GrpcKvStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration remaining = deadline - absl::Now();
    // The server treats 0 as its default (30 s), so never send less than 1 ms.
    const absl::Duration slice = std::max(absl::Milliseconds(1), std::min(remaining, kMaxServerWait));
    v1::KvWaitRequest request;
    request.set_job(job_);
    request.set_restart_epoch(restart_epoch_);
    Identify(request);
    for (const std::string& k : keys) request.add_keys(k);
    request.mutable_timeout()->set_seconds(absl::ToInt64Seconds(slice));
    request.mutable_timeout()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(slice - absl::Seconds(absl::ToInt64Seconds(slice)))));
    v1::KvWaitResponse response;
    grpc::ClientContext context;
    Prepare(context, slice + kReplySlack);
    grpc::Status s = stub_->KvWait(&context, request, &response);
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpc(s, absl::StrCat("KvWait (", keys.size(), " keys)"));
    }
    if (absl::Now() >= deadline) break;
  }
  // Name the missing keys: that says which peer never arrived.
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (Get(k).status().code() == absl::StatusCode::kNotFound) missing.push_back(k);
  }
  return RendezvousTimeoutError(missing, timeout);
}

}  // namespace comm
}  // namespace recfleet
