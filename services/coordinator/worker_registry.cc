#include "services/coordinator/worker_registry.h"

#include "absl/random/random.h"
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
  if (it != workers_.end()) {
    if (replaced != nullptr) *replaced = it->second;
    workers_.erase(it);
  }
  WorkerRecord& w = workers_[id];
  w.id = id;
  w.info = info;
  w.info.set_worker_id(id);
  w.registered = now;
  w.lease_expiry = now + lease_;
  return &w;
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Renew(const std::string& id, absl::Time now) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.lease_expiry <= now) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", id, " is not registered (unknown, or its lease expired); call RegisterWorker"));
  }
  it->second.lease_expiry = now + lease_;
  return &it->second;
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
