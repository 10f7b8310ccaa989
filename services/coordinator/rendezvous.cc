#include "services/coordinator/rendezvous.h"

#include "absl/strings/str_cat.h"

namespace recfleet::coordinator {

Rendezvous::Rendezvous() : timer_([this] { TimerLoop(); }) {}

Rendezvous::~Rendezvous() {
  Shutdown();
  timer_.join();
}

void Rendezvous::Shutdown() {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [job, ns] : namespaces_) {
      FailAll(ns, absl::UnavailableError("the coordinator is shutting down"), fired);
    }
  }
  for (auto& [done, result] : fired) done(std::move(result));
}

void Rendezvous::FailAll(Namespace& ns, const absl::Status& status, Fired& fired) {
  for (auto& [id, w] : ns.waiters) fired.emplace_back(std::move(w.done), status);
  ns.waiters.clear();
}

void Rendezvous::CollectReady(Namespace& ns, Fired& fired) {
  for (auto it = ns.waiters.begin(); it != ns.waiters.end();) {
    std::vector<std::string> values;
    bool all = true;
    for (const std::string& k : it->second.keys) {
      auto v = ns.values.find(k);
      if (v == ns.values.end()) {
        all = false;
        break;
      }
      values.push_back(v->second);
    }
    if (all) {
      fired.emplace_back(std::move(it->second.done), std::move(values));
      it = ns.waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void Rendezvous::Open(const std::string& job, int64_t epoch) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    Namespace& ns = namespaces_[job];
    FailAll(ns,
            absl::FailedPreconditionError(absl::StrCat(
                job, ": restart_epoch ", ns.epoch, " is stale, the job moved to epoch ", epoch)),
            fired);
    ns.values.clear();
    ns.epoch = epoch;
  }
  for (auto& [done, result] : fired) done(std::move(result));
}

void Rendezvous::Close(const std::string& job) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    auto it = namespaces_.find(job);
    if (it == namespaces_.end()) return;
    FailAll(it->second,
            absl::NotFoundError(absl::StrCat(job, " has no rendezvous any more (job ended or "
                                                  "is waiting for workers)")),
            fired);
    namespaces_.erase(it);
  }
  for (auto& [done, result] : fired) done(std::move(result));
}

absl::Status Rendezvous::CheckLocked(const std::string& job, int64_t epoch) const {
  auto it = namespaces_.find(job);
  if (it == namespaces_.end()) {
    return absl::NotFoundError(
        absl::StrCat(job, " has no rendezvous (it is not SCHEDULING or RUNNING)"));
  }
  if (epoch != it->second.epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": ", epoch < it->second.epoch ? "stale" : "unknown future",
                     " restart_epoch ", epoch, ", the job is at epoch ", it->second.epoch));
  }
  return absl::OkStatus();
}

absl::Status Rendezvous::Set(const std::string& job, int64_t epoch, const std::string& key,
                             std::string value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of key \"", key, "\" must be at most ", kMaxValueBytes,
                     " bytes, got ", value.size()));
  }
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLocked(job, epoch); !s.ok()) return s;
    Namespace& ns = namespaces_[job];
    ns.values[key] = std::move(value);
    CollectReady(ns, fired);
  }
  for (auto& [done, result] : fired) done(std::move(result));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Rendezvous::Get(const std::string& job, int64_t epoch,
                                            const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLocked(job, epoch); !s.ok()) return s;
  const Namespace& ns = namespaces_.at(job);
  auto it = ns.values.find(key);
  if (it == ns.values.end()) {
    return absl::NotFoundError(
        absl::StrCat("key \"", key, "\" is not set for ", job, " epoch ", epoch));
  }
  return it->second;
}

void Rendezvous::Wait(const std::string& job, int64_t epoch, std::vector<std::string> keys,
                      absl::Time deadline, WaitCallback done) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = stopping_ ? absl::UnavailableError("the coordinator is shutting down")
                               : CheckLocked(job, epoch);
    if (s.ok() && keys.empty()) s = absl::InvalidArgumentError("keys must list at least one key");
    if (!s.ok()) {
      fired.emplace_back(std::move(done), s);
    } else {
      Namespace& ns = namespaces_[job];
      ns.waiters[next_waiter_++] = Waiter{std::move(keys), deadline, std::move(done)};
      CollectReady(ns, fired);
    }
  }
  for (auto& [cb, result] : fired) cb(std::move(result));
}

int64_t Rendezvous::key_count() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [job, ns] : namespaces_) n += ns.values.size();
  return n;
}

void Rendezvous::TimerLoop() {
  while (true) {
    Fired fired;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      absl::Time now = absl::Now();
      absl::Time next = now + absl::Milliseconds(200);
      for (auto& [job, ns] : namespaces_) {
        for (auto it = ns.waiters.begin(); it != ns.waiters.end();) {
          if (it->second.deadline <= now) {
            fired.emplace_back(std::move(it->second.done),
                               absl::DeadlineExceededError(absl::StrCat(
                                   "rendezvous wait for ", it->second.keys.size(), " key(s) of ",
                                   job, " timed out")));
            it = ns.waiters.erase(it);
          } else {
            next = std::min(next, it->second.deadline);
            ++it;
          }
        }
      }
      if (fired.empty()) {
        // Wakes at the earliest deadline (or every 200 ms to notice new
        // waiters with earlier deadlines and shutdown).
        mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
        continue;
      }
    }
    for (auto& [done, result] : fired) done(std::move(result));
  }
}

}  // namespace recfleet::coordinator
