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
  // A job's keys (Gloo addresses, NCCL ids) are its workers' alone. The
  // epoch is left to the rendezvous: a worker holding the job holds it at
  // the job's current epoch, which is the namespace's epoch, so a call of
  // another epoch gets its FAILED_PRECONDITION ("stale restart_epoch").
  if ((*w)->idle() || job.size() != (*w)->job_id.size() + 5 ||
      job.compare(5, std::string::npos, (*w)->job_id) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", worker_id, " is not assigned to ", job,
        "; a job's rendezvous keys are open only to the workers running it"));
  }
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
