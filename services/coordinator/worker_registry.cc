#include "services/coordinator/worker_registry.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace recfleet::coordinator {
namespace {

bool ValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

std::string NewWorkerId() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  std::string id = "w";
  for (int i = 0; i < 11; ++i) id.push_back(kAlphabet[absl::Uniform(gen, 0, 36)]);
  return id;
}

// 32 bytes from the kernel's CSPRNG, hex-encoded.
absl::StatusOr<std::string> NewCredential() {
  char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot draw a worker credential: getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

// Compares in time independent of where the strings differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<WorkerRecord*> WorkerRegistry::Register(
    const ::recfleet::v1::RegisterWorkerRequest& info, absl::Time now, WorkerRecord* replaced) {
  if (info.host().empty()) {
    return absl::InvalidArgumentError("host is required (the worker's hostname or IP), got \"\"");
  }
  std::string id = info.worker_id();
  if (id.empty()) {
    do {
      id = NewWorkerId();
    } while (workers_.count(id));
  } else if (!ValidWorkerId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id must be 1-128 characters of [A-Za-z0-9._-], got \"", id, "\""));
  }
  auto it = workers_.find(id);
  if (it != workers_.end() && it->second.lease_expiry > now &&
      !SameSecret(info.worker_credential(), it->second.credential)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", id, " is registered and its lease is live; registering it again needs its "
        "worker_credential (a restarted worker can register once the lease has ended)"));
  }
  absl::StatusOr<std::string> credential = NewCredential();
  if (!credential.ok()) return credential.status();
  if (it != workers_.end()) {
    if (replaced != nullptr) *replaced = it->second;
    workers_.erase(it);
  }
  WorkerRecord& w = workers_[id];
  w.id = id;
  w.credential = *std::move(credential);
  w.info = info;
  w.info.set_worker_id(id);
  w.info.clear_worker_credential();
  w.registered = now;
  w.lease_expiry = now + lease_;
  return &w;
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Authenticate(const std::string& id,
                                                           const std::string& credential) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", id, " is not registered; call RegisterWorker"));
  }
  if (!SameSecret(credential, it->second.credential)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker_credential does not match worker ", id,
        "'s registration (send the one from its latest RegisterWorkerResponse)"));
  }
  return &it->second;
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Renew(const std::string& id,
                                                    const std::string& credential,
                                                    absl::Time now) {
  absl::StatusOr<WorkerRecord*> w = Authenticate(id, credential);
  if (!w.ok()) return w.status();
  if ((*w)->lease_expiry <= now) {
    return absl::NotFoundError(
        absl::StrCat("worker ", id, " is not registered (its lease expired); call RegisterWorker"));
  }
  (*w)->lease_expiry = now + lease_;
  return *w;
}

WorkerRecord* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<WorkerRecord> WorkerRegistry::Expire(absl::Time now) {
  std::vector<WorkerRecord> out;
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.lease_expiry <= now) {
      out.push_back(std::move(it->second));
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

int64_t WorkerRegistry::idle_count() const {
  int64_t n = 0;
  for (const auto& [id, w] : workers_) n += w.idle();
  return n;
}

}  // namespace recfleet::coordinator
