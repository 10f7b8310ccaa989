#include "services/coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/time_util.h"

namespace recfleet::coordinator {

namespace {

constexpr absl::Duration kMaxKvWait = absl::Seconds(300);
constexpr absl::Duration kDefaultKvWait = absl::Seconds(30);

}  // namespace

absl::Status Coordinator::AuthorizeKv(const std::string& worker_id, const std::string& credential,
                                      const std::string& job) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<WorkerRecord*> w = registry_.Authenticate(worker_id, credential);
  if (!w.ok()) return w.status();
  (void)job;
  return absl::OkStatus();
}

absl::Status Coordinator::KvSet(const ::recfleet::v1::KvSetRequest& request) {
  if (absl::Status s = AuthorizeKv(request.worker_id(), request.worker_credential(), request.job());
      !s.ok()) {
    return s;
  }
  return rendezvous_.Set(request.job(), request.restart_epoch(), request.key(), request.value());
}

absl::StatusOr<::recfleet::v1::KvGetResponse> Coordinator::KvGet(
    const ::recfleet::v1::KvGetRequest& request) {
  if (absl::Status s = AuthorizeKv(request.worker_id(), request.worker_credential(), request.job());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> v =
      rendezvous_.Get(request.job(), request.restart_epoch(), request.key());
  if (!v.ok()) return v.status();
  ::recfleet::v1::KvGetResponse out;
  out.set_value(*std::move(v));
  return out;
}

void Coordinator::KvWait(
    const ::recfleet::v1::KvWaitRequest& request,
    std::function<void(absl::StatusOr<::recfleet::v1::KvWaitResponse>)> done) {
  absl::Duration timeout = FromProto(request.timeout());
  if (timeout < absl::ZeroDuration() || timeout > kMaxKvWait) {
    done(absl::InvalidArgumentError(absl::StrCat("timeout must be in [0s, 300s] (0 = 30s), got ",
                                                 absl::FormatDuration(timeout))));
    return;
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultKvWait;
  if (absl::Status s = AuthorizeKv(request.worker_id(), request.worker_credential(), request.job());
      !s.ok()) {
    done(s);
    return;
  }
  std::vector<std::string> keys(request.keys().begin(), request.keys().end());
  rendezvous_.Wait(request.job(), request.restart_epoch(), keys, absl::Now() + timeout,
                   [keys, done = std::move(done)](absl::StatusOr<std::vector<std::string>> r) {
                     if (!r.ok()) {
                       done(r.status());
                       return;
                     }
                     ::recfleet::v1::KvWaitResponse out;
                     for (size_t i = 0; i < keys.size(); ++i) {
                       auto* kv = out.add_values();
                       kv->set_key(keys[i]);
                       kv->set_value((*r)[i]);
                     }
                     done(std::move(out));
                   });
}

}  // namespace recfleet::coordinator
